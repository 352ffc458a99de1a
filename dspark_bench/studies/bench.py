"""Engine benchmark: what the harness itself costs, measured by the code that measures the methods.

Three measurements, all on the same prompts, dtype and machine (timing claims live here, never in tests):

1. **overhead** (:func:`overhead`): for each concurrency R and drafter, the drafters decode every prompt with
   continuous batching, their sessions interleaved round by round (as :mod:`dspark_bench.engines.native.runner` does). From
   the rounds (:mod:`dspark_bench.evaluation.metrics`): ``overhead_share`` (non-forward share of round time; goal <= 3%
   on CPU, <= 5% on an H200), ``markov_head_share`` (DSpark's Markov head compute apart from sampling; goal
   <= 2% of a DSpark round), ``sample_share``, per-request and system tokens/s and the mean batch occupancy.
2. **vs HF at concurrency 1** (:func:`versus_hf`): our ``none`` against ``model.generate()`` (greedy or plain
   sampling), prompt by prompt, interleaved per prompt; end-to-end tokens/s (prefill + decode). Goal >= 1.0x.
3. **vs HF batched at concurrency B** (B = 8 by default): the same groups of B prompts through our engine at
   concurrency B and through one left-padded ``generate()`` call each; end-to-end tokens/s, where a sequence's
   tokens are counted up to its first EOS. Goal >= 1.0x.

Every number is per repeat, with the median over repeats; ratios are medians of per-repeat ratios.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.records import record_from_result
from dspark_bench.core.rounds import Request, RequestResult
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.engines.native.runner import interleave
from dspark_bench.evaluation.metrics import (
    occupancy,
    per_request_tokens_per_s,
    system_tokens_per_s,
    time_shares,
)
from dspark_bench.target.model import Target

BENCH_JSON = "bench.json"


@dataclass(frozen=True)
class BenchSpec:
    suite: str = "all"
    limit: int = 10  # prompts per dataset
    max_new_tokens: int = 64
    temperature: float = 1.0
    repeats: int = 3
    block_size: int = 7
    concurrency: tuple[int, ...] = (1, 8, 32)
    drafters: tuple[str, ...] = ("none", "ngram", "dspark")
    hf_batch: int = 8  # 0: skip the batched comparison
    hf: bool = True  # False: skip both HF comparisons
    seed: int = 980406

    def __post_init__(self):
        if self.repeats < 1 or self.limit < 1 or self.max_new_tokens < 1 or not (0 <= self.temperature < math.inf):
            raise ValueError("repeats, limit and max_new_tokens must be >= 1 and temperature a finite number >= 0, got "
                             f"{self.repeats}, {self.limit}, {self.max_new_tokens}, {self.temperature}")
        if not self.concurrency or min(self.concurrency) < 1 or self.hf_batch < 0:
            raise ValueError(f"concurrency levels must be >= 1 and hf_batch >= 0, got {self.concurrency}, "
                             f"{self.hf_batch}")


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


# ---- 1. overhead --------------------------------------------------------------------------------------------
def overhead(target: Target, requests: Sequence[Request], spec: BenchSpec, engines: dict[str, RoundLoop],
             concurrency: int) -> dict:
    """Per drafter: the metrics of module step 1 at ``concurrency``, per repeat and median."""
    per: dict[str, list[dict]] = {name: [] for name in engines}
    for rep in range(spec.repeats):
        got: dict[str, list[RequestResult]] = {name: [] for name in engines}
        sessions = [replace_concurrency(e, concurrency).session(requests, got[n].append) for n, e in engines.items()]
        interleave(sessions if rep % 2 == 0 else sessions[::-1])
        for name, results in got.items():
            recs = [record_from_result(r, name, "fixed", r.request.request_id, rep, concurrency) for r in results]
            ok = [r for r in recs if r.ok]
            per[name].append({"per_request_tokens_per_s": per_request_tokens_per_s(ok),
                              "system_tokens_per_s": system_tokens_per_s(ok), **time_shares(ok),
                              **occupancy(ok, concurrency), "errors": len(recs) - len(ok)})
    return {name: {"repeats": reps, "median": {k: _median([r[k] for r in reps]) for k in reps[0]}}
            for name, reps in per.items()}


def replace_concurrency(engine: RoundLoop, concurrency: int) -> RoundLoop:
    return RoundLoop(engine.target, engine.drafter, replace(engine.config, concurrency=concurrency), engine.scheduler)


# ---- 2./3. against HF generate --------------------------------------------------------------------------------
def _hf_generate(target: Target, spec: BenchSpec, group: Sequence[Request]) -> int:
    """One left-padded ``generate()`` over ``group``; returns the tokens generated, each row up to its first EOS."""
    width = max(len(r.prompt_ids) for r in group)
    ids = torch.tensor([[0] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in group], device=target.device)
    mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in group],
                        device=target.device)
    sampling = ({"do_sample": True, "temperature": spec.temperature, "top_k": 0, "top_p": 1.0}
                if spec.temperature else {"do_sample": False})
    torch.manual_seed(group[0].seed)
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=mask, max_new_tokens=spec.max_new_tokens,
                                    eos_token_id=sorted(target.eos_ids), pad_token_id=0, **sampling)
    return sum(_until_eos(row, target.eos_ids) for row in out[:, width:].tolist())


def _until_eos(row: list[int], eos: frozenset[int]) -> int:
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


def _ours(engine: RoundLoop, group: Sequence[Request]) -> int:
    results: list[RequestResult] = []
    engine.run(group, results.append)
    return sum(len(r.output_ids) for r in results)


def timed(fn: Callable[[], int], device: torch.device) -> tuple[int, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    n = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n, time.perf_counter() - t0


def versus_hf(target: Target, requests: Sequence[Request], spec: BenchSpec, none: RoundLoop, batch: int) -> dict:
    """Our ``none`` vs HF ``generate`` on groups of ``batch`` prompts (1: prompt by prompt), interleaved per
    group in alternating order; end-to-end tokens/s per repeat, medians and the median ratio."""
    ours = replace_concurrency(none, batch)
    groups = [requests[i : i + batch] for i in range(0, len(requests), batch)]
    _ours(ours, groups[0][:1])  # warm-up, untimed
    _hf_generate(target, spec, groups[0][:1])
    reps = []
    for rep in range(spec.repeats):
        totals = {"ours:none": [0, 0.0], "hf:generate": [0, 0.0]}
        for i, group in enumerate(groups):
            arms = [("ours:none", lambda g=group: _ours(ours, g)),
                    ("hf:generate", lambda g=group: _hf_generate(target, spec, g))]
            for name, fn in arms if (rep + i) % 2 == 0 else arms[::-1]:
                n, dt = timed(fn, target.device)
                totals[name][0] += n
                totals[name][1] += dt
        reps.append({m: {"tokens": n, "seconds": s, "tokens_per_s": n / s if s else None}
                     for m, (n, s) in totals.items()})
    ratios = [r["ours:none"]["tokens_per_s"] / r["hf:generate"]["tokens_per_s"] for r in reps]
    return {"batch": batch, "prompts": len(requests), "repeats": reps,
            "median_tokens_per_s": {m: _median([r[m]["tokens_per_s"] for r in reps]) for m in reps[0]},
            "ours_over_hf": {"per_repeat": ratios, "median": statistics.median(ratios)}}


# ---- the whole benchmark ------------------------------------------------------------------------------------
def run_bench(target: Target, requests: Sequence[Request], spec: BenchSpec,
              drafter_options: dict[str, dict[str, str]] | None = None, log=lambda msg: None) -> dict:
    """Every measurement of the module docstring; returns a JSON-ready dict."""
    config = EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, 1)
    engines = {n: RoundLoop(target, drafter_registry.create(n, target, (drafter_options or {}).get(n)), config)
               for n in spec.drafters}
    warm = [replace(requests[0], request_id=-1)]
    for engine in engines.values():  # warm-up, untimed
        RoundLoop(target, engine.drafter, replace(config, max_new_tokens=min(8, spec.max_new_tokens))).run(warm, _drop)
    out: dict = {"spec": asdict(spec), "prompts": len(requests), "overhead": {}}
    for conc in spec.concurrency:
        out["overhead"][str(conc)] = overhead(target, requests, spec, engines, conc)
        log(f"c={conc}: " + ", ".join(f"{n} overhead {_pct(v['median']['overhead_share'])}"
                                      for n, v in out["overhead"][str(conc)].items()))
    if spec.hf:
        none = engines.get("none") or RoundLoop(target, drafter_registry.create("none", target), config)
        out["vs_hf"] = {"1": versus_hf(target, requests, spec, none, 1)}
        if spec.hf_batch > 1:
            out["vs_hf"][str(spec.hf_batch)] = versus_hf(target, requests, spec, none, spec.hf_batch)
        log("ours none / HF generate: " + ", ".join(f"c={b} {v['ours_over_hf']['median']:.3f}x"
                                                    for b, v in out["vs_hf"].items()))
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _drop(result: RequestResult) -> None:
    """``on_result`` of untimed warm-up runs."""

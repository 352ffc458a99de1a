"""Core speed benchmark: our loop against Hugging Face ``generate()`` on the same prompts, dtype and machine.

For each temperature and repeat, every method decodes the same prompts back to back (interleaved per prompt,
so machine noise hits all methods alike): our ``none`` and ``ngram`` through the engine, HF ``generate()``
(plain sampling / greedy) and HF prompt-lookup decoding (``prompt_lookup_num_tokens``). Rates are end-to-end
(prefill + decode) tokens per second per method, pooled over prompts; we report per-repeat values, medians
and the median of per-repeat ratios. Timing claims live here, never in test assertions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from dspark_bench import drafters
from dspark_bench.engine import Engine, EngineConfig, Request
from dspark_bench.target import Target

METHODS = ("ours:none", "hf:generate", "ours:ngram", "hf:prompt-lookup")
RATIOS = (("ours:none", "hf:generate"), ("ours:ngram", "hf:prompt-lookup"), ("ours:ngram", "ours:none"))


@dataclass(frozen=True)
class BenchSpec:
    suite: str = "code"
    limit: int = 5
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3
    block_size: int = 7
    max_ngram: int = 3
    seed: int = 980406


def _ours(target: Target, name: str, spec: BenchSpec, temperature: float) -> Callable[[Request], int]:
    drafter = drafters.create(name, target, {"max_ngram": spec.max_ngram} if name == "ngram" else None)
    engine = Engine(target, drafter, EngineConfig(spec.max_new_tokens, temperature, spec.block_size))

    def generate(req: Request) -> int:
        results = []
        engine.run([req], results.append)
        return len(results[0].output_ids)

    return generate


def _hf(target: Target, spec: BenchSpec, temperature: float, lookup: bool) -> Callable[[Request], int]:
    extra = {"prompt_lookup_num_tokens": spec.block_size, "max_matching_ngram_size": spec.max_ngram} if lookup else {}
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
        "do_sample": False}

    def generate(req: Request) -> int:
        torch.manual_seed(req.seed)
        ids = torch.tensor([req.prompt_ids], device=target.device)
        with torch.inference_mode():
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=spec.max_new_tokens,
                                        eos_token_id=sorted(target.eos_ids), pad_token_id=0, **sampling, **extra)
        return int(out.shape[1] - ids.shape[1])

    return generate


def _timed(fn: Callable[[Request], int], req: Request) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = fn(req)
    return n, time.perf_counter() - t0


def run_bench(target: Target, requests: Sequence[Request], spec: BenchSpec, log=lambda msg: None) -> dict:
    """Measure every method at every temperature; returns a JSON-ready dict."""
    out = {"spec": asdict(spec), "temperatures": {}}
    for temp in spec.temperatures:
        methods = {
            "ours:none": _ours(target, "none", spec, temp), "ours:ngram": _ours(target, "ngram", spec, temp),
            "hf:generate": _hf(target, spec, temp, lookup=False), "hf:prompt-lookup": _hf(target, spec, temp, True),
        }
        for fn in methods.values():  # warm-up, untimed
            fn(Request(-1, requests[0].prompt_ids, 0))
        reps = []
        for rep in range(spec.repeats):
            totals = {m: [0, 0.0] for m in methods}
            for req in requests:
                for name, fn in methods.items():
                    n, dt = _timed(fn, req)
                    totals[name][0] += n
                    totals[name][1] += dt
            reps.append({m: {"tokens": n, "seconds": s, "tokens_per_s": n / s} for m, (n, s) in totals.items()})
            log(f"T={temp} repeat {rep + 1}: " + ", ".join(f"{m} {v['tokens_per_s']:.1f} tok/s" for m, v in reps[-1].items()))
        out["temperatures"][str(temp)] = _aggregate(reps)
    return out


def _aggregate(reps: list[dict]) -> dict:
    med = {m: statistics.median(r[m]["tokens_per_s"] for r in reps) for m in METHODS}
    ratios = {f"{a} / {b}": [r[a]["tokens_per_s"] / r[b]["tokens_per_s"] for r in reps] for a, b in RATIOS}
    return {
        "repeats": reps,
        "median_tokens_per_s": med,
        "ratios": {k: {"per_repeat": v, "median": statistics.median(v)} for k, v in ratios.items()},
    }

"""The target's ``fast`` forward path (:mod:`dspark_bench.target.fast`) against another: ``hf`` (transformers' own)
``fast-unpacked`` (the fast path without the weights packed for oneDNN: what the packing alone is worth) or
``fast-grouped`` (the fast path with padded, length-grouped prefills: what prefilling prompts end to end is worth).

Both paths run in one process on one set of weights (the fast path's fused matrices; the HF modules read views
of them), and every measurement alternates them in pairs (fast then other, then other then fast, ...), so that
whatever else loads the machine loads both alike and neither always runs right after the other: on a shared machine
only the ratios fast / other mean anything, and they are medians of per-pair ratios. Three measurements:

1. **step** (:func:`step_ratio`): one target forward of R rows x L tokens over a cache of ``context`` columns (L =
   1: a decode step; L = k + 1: a verify block), then the block is rolled back (kept 0, cropped), so every timed
   step sees the same cache.
2. **prefill** (:func:`prefill_ratio`): one admission, the prefill of the first C prompts of the requests, at each
   generation concurrency C > 1.
3. **generate** (:func:`generate_ratio`): ``none`` through the one engine loop (prefill, first token, greedy
   steps) for a list of requests at concurrency R; per-pair ratio of wall time, and whether both paths produced
   the same tokens (expected in fp32; bf16 may differ within a few tokens, as any two kernels' roundings do).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.rounds import Request
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.target.model import Target


@dataclass(frozen=True)
class Paired:
    """Per-pair seconds of the two paths; ``ratio`` = median over pairs of fast / other (< 1: fast is faster)."""

    fast_s: tuple[float, ...]
    other_s: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return statistics.median(f / h for f, h in zip(self.fast_s, self.other_s, strict=True))

    def summary(self) -> dict:
        return {"fast_median_ms": 1e3 * statistics.median(self.fast_s),
                "other_median_ms": 1e3 * statistics.median(self.other_s), "ratio_fast_over_other": self.ratio,
                "pairs": len(self.fast_s)}


AGAINST = ("hf", "fast-unpacked", "fast-grouped", "fast-sdpa")  # what the fast path can be measured against


def paths(target: Target, against: str = "hf") -> tuple[Target, Target]:
    """The fast path and ``against`` (:data:`AGAINST`) over ``target``'s model (one copy of the weights)."""
    if against not in AGAINST:
        raise ValueError(f"unknown path {against!r} to measure the fast path against; accepted: {', '.join(AGAINST)}")
    fast = target if target.forward_path == "fast" else Target(target.model, target.tokenizer, target.name, "fast")
    return fast, Target(fast.model, fast.tokenizer, fast.name, against)


def alternate(fast: Callable[[], float], other: Callable[[], float], pairs: int, warmup: int = 2) -> Paired:
    """Call the two in pairs, fast first in even pairs and other first in odd ones (``warmup`` untimed pairs first),
    so that neither always runs right after the other; each call returns its own seconds."""
    for _ in range(warmup):
        fast(), other()
    timed = []
    for i in range(pairs):
        if i % 2:
            o = other()
            timed.append((fast(), o))
        else:
            timed.append((fast(), other()))
    return Paired(tuple(t[0] for t in timed), tuple(t[1] for t in timed))


def step_ratio(fast: Target, other: Target, rows: int, width: int, context: int, pairs: int = 30,
               seed: int = 0) -> Paired:
    """Seconds of one forward of ``rows`` x ``width`` new tokens over ``context`` cached columns, per path."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, fast.vocab_size, (rows, context), generator=gen).tolist()
    ids = torch.randint(3, fast.vocab_size, (rows, width), generator=gen)

    def stepper(target: Target) -> Callable[[], float]:
        batch, _ = target.prefill(prompts)

        def step() -> float:
            t0 = time.perf_counter()
            target.forward_block(batch, ids, [width] * rows)
            seconds = time.perf_counter() - t0
            target.keep(batch, [0] * rows)  # roll the block back: the next step sees the same cache
            return seconds

        return step

    return alternate(stepper(fast), stepper(other), pairs)


def prefill_ratio(fast: Target, other: Target, prompts: Sequence[Sequence[int]], pairs: int = 5) -> Paired:
    """Seconds of one prefill of ``prompts`` (a fresh cache each time), per path."""
    lists = [list(p) for p in prompts]

    def prefiller(target: Target) -> Callable[[], float]:
        def prefill() -> float:
            t0 = time.perf_counter()
            target.prefill(lists)
            return time.perf_counter() - t0

        return prefill

    return alternate(prefiller(fast), prefiller(other), pairs, warmup=1)


def generate_ratio(fast: Target, other: Target, requests: Sequence[Request], concurrency: int, max_new_tokens: int = 64,
                   pairs: int = 3) -> tuple[Paired, bool]:
    """Wall seconds of ``none`` decoding ``requests`` greedily at ``concurrency``, per path, and whether every
    request got the same tokens on both paths."""
    config = EngineConfig(max_new_tokens=max_new_tokens, temperature=0.0, concurrency=concurrency)
    outputs: dict[str, dict[int, tuple[int, ...]]] = {"fast": {}, "other": {}}

    def runner(name: str, target: Target) -> Callable[[], float]:
        loop = RoundLoop(target, drafter_registry.create("none", target), config)

        def run() -> float:
            t0 = time.perf_counter()
            loop.run(requests, lambda res: outputs[name].__setitem__(res.request.request_id, res.output_ids))
            return time.perf_counter() - t0

        return run

    timed = alternate(runner("fast", fast), runner("other", other), pairs, warmup=1)
    return timed, outputs["fast"] == outputs["other"]


@dataclass(frozen=True)
class ForwardSpec:
    """What :func:`measure` times: step shapes (every R in ``rows`` x every L in ``widths`` over ``context`` cached
    columns) and ``none`` generation of ``max_new_tokens`` for the given requests at each R in ``concurrency``."""

    rows: tuple[int, ...] = (1, 8)
    widths: tuple[int, ...] = (1, 8)
    context: int = 256
    step_pairs: int = 30
    concurrency: tuple[int, ...] = (1, 8)
    max_new_tokens: int = 64
    generate_pairs: int = 3

    def __post_init__(self):
        empty = not (self.rows and self.widths and self.concurrency)
        if empty or min(*self.rows, *self.widths, *self.concurrency, self.context, self.step_pairs,
                        self.max_new_tokens, self.generate_pairs) < 1:
            raise ValueError("rows, widths, concurrency, context, pairs and max_new_tokens must all be >= 1")


def measure(target: Target, requests: Sequence[Request], spec: ForwardSpec,
            log: Callable[[str], None] = lambda line: None, against: str = "hf") -> dict:
    """Every step shape and generation of ``spec``, fast against ``against`` (module docstring): a dict for JSON."""
    fast, other = paths(target, against)
    steps = []
    for rows in spec.rows:
        for width in spec.widths:
            row = {"rows": rows, "width": width, "context": spec.context,
                   **step_ratio(fast, other, rows, width, spec.context, spec.step_pairs).summary()}
            log(f"step R={rows} L={width}: fast/{against} {row['ratio_fast_over_other']:.3f}")
            steps.append(row)
    prefills = []
    for c in sorted({min(c, len(requests)) for c in spec.concurrency if c > 1}):
        prompts = [r.prompt_ids for r in requests[:c]]
        row = {"prompts": c, "tokens": sum(map(len, prompts)),
               **prefill_ratio(fast, other, prompts, spec.generate_pairs + 2).summary()}
        log(f"prefill of {c} prompts: fast/{against} {row['ratio_fast_over_other']:.3f}")
        prefills.append(row)
    generations = []
    for c in spec.concurrency:
        timed, same = generate_ratio(fast, other, requests, c, spec.max_new_tokens, spec.generate_pairs)
        row = {"concurrency": c, "requests": len(requests), "max_new_tokens": spec.max_new_tokens,
               **timed.summary(), "same_tokens": same}
        log(f"generate c={c}: fast/{against} {row['ratio_fast_over_other']:.3f} (same tokens: {same})")
        generations.append(row)
    return {"against": against, "linear_kernel": {"fast": fast.linear_kernel, "other": other.linear_kernel},
            "attention_kernel": {"fast": fast.attention_kernel, "other": other.attention_kernel},
            "steps": steps, "prefill": prefills, "generate": generations}

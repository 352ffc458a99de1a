"""Round costs measured through the engine: each drafter's propose and the engine's own overhead per round, the
parts of a profile (:mod:`dspark_bench.scheduling.profile`) that need real engine rounds."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dspark_bench import drafters as registry
from dspark_bench.core.rounds import Request
from dspark_bench.drafters.base import Drafter
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.scheduling.profile import DEFAULT_ROWS, Curve, ProfileError, isotonic
from dspark_bench.target.model import Target


def measure_round_costs(target: Target, drafters: Mapping[str, Drafter], rows: Sequence[int] = DEFAULT_ROWS,
                        block_size: int = 7, context: int = 128, rounds: int = 5, warmup: int = 1,
                        seed: int = 0) -> tuple[dict[str, Curve], Curve]:
    """Median seconds per round at each R, from real engine rounds over R random prompts of ``context`` tokens
    (fixed verification of the whole block, every request in flight): each drafter's ``draft_s`` (its
    ``propose``), and the engine overhead = ``draft_s + other_s`` of vanilla (``none``) rounds, i.e. the
    round's time outside the target's forward. Acceptance over a wider block costs a little more than a
    vanilla round's; that difference is left in the overhead curve's error."""
    if rounds < 1 or warmup < 0 or not rows or min(rows) < 1 or context < 1 or block_size < 1:
        raise ProfileError("need rounds >= 1, warmup >= 0, positive rows, context and block size")
    gen = torch.Generator().manual_seed(seed)
    arms = {"none": registry.create("none", target), **drafters}
    curves: dict[str, list[float]] = {name: [] for name in arms}
    eos, target.eos_ids = target.eos_ids, frozenset()  # timed requests run their full length: no EOS ends one
    try:
        for r in sorted(set(rows)):
            prompts = torch.randint(3, target.vocab_size, (r, context), generator=gen).tolist()
            for name, drafter in arms.items():
                stats = _engine_rounds(target, drafter, prompts, block_size, warmup + rounds)[warmup:]
                if name == "none":
                    curves[name].append(statistics.median(s.draft_s + s.other_s for s in stats))
                else:
                    curves[name].append(statistics.median(s.draft_s for s in stats))
    finally:
        target.eos_ids = eos
    grid = tuple(sorted(set(rows)))
    made = {name: Curve(grid, tuple(isotonic(np.array(v)).tolist())) for name, v in curves.items()}
    return {k: v for k, v in made.items() if k != "none"}, made["none"]


def _engine_rounds(target: Target, drafter: Drafter, prompts: list[list[int]], block_size: int, n: int) -> list:
    """The first ``n`` rounds (:class:`~dspark_bench.core.rounds.RoundStats`) of one engine pass over ``prompts``, all
    in flight at once (no EOS: the caller cleared the target's), cut short once they are done."""
    engine = RoundLoop(target, drafter, EngineConfig(10 * n * (block_size + 1), 1.0, block_size, len(prompts)))
    session = engine.session([Request(i, tuple(p), 1000 + i) for i, p in enumerate(prompts)], lambda result: None)
    while session.step() and len(session.live[0].rounds) < n:
        pass
    return list(session.live[0].rounds)

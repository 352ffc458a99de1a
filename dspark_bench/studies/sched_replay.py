"""Replay a recorded `hardware-aware` cell's inputs through a new scheduler and say, round by round, what it would
plan against what the engine did (``dspark-bench study sched-replay CELL_RUN_FOLDER --profile PROFILE [--calibration CAL]
[--repeats 0,1]``): the promised throughput of drafting over a vanilla step (the plan's own ``last_promise``),
kappa, the expected first-position survival and the corrections at that R.

The scheduler is fed exactly what the engine gave it, from the records: each round's slots and positions, the
previous round's timing (``ctx.last_round``), the drafter's proposal and confidences where the drafter ran, and
the verified and accepted counts. A round's rows share one timing row, which joins them into the round; rounds
are put in order by each request's own sequence and by the requests still queued (:func:`ordered_rounds`).

The replay runs the scheduler of the checkout it runs in: to replay a committed sweep, run it in a checkout of
the sweep's commit (``commit.txt``; e.g. ``git worktree add``). So run, it plans what the engine planned: on the
sweep of ``baselines/scheduling-smollm2/2026-12-03-69e88aa-avx2-fp32``, every round of both repeats at R = 2 to 32
(775, 345, 247, 124 and 62 rounds) and all but one of 1,945 at R = 1, the first vanilla step, which the run's
warmup had taken (before commit 264a11f the warmup decoded with the run's own scheduler; now it decodes with a
copy). Before commit 4984501 the rounds of two stretches that share no request were put in any order, and the
replay seemed to diverge from the engine (at R = 2 in 116 of 424 rounds of repeat 1, at R = 1 in 149 of 968 of
repeat 0). A drafter that may propose nothing (``ngram``) leaves rounds the plan let it draft looking like skipped
ones: the records cannot tell them apart.
"""

from __future__ import annotations

from graphlib import TopologicalSorter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from dspark_bench.drafters.base import DraftContext, Proposal, RoundTiming
from dspark_bench.evaluation.runs import read_manifest, read_records
from dspark_bench.scheduling import schedulers


def ordered_rounds(records, queue: list[tuple[str, str]] | None = None) -> list[list[tuple]]:
    """The engine's rounds in the order it ran them, each a list of (record, round index, position at the round's
    start) in the batch's order. ``queue``: the run's (dataset, prompt_id) in queue order (its manifest's
    ``prompts``), the order requests joined the batch; without it, by index within the dataset.

    A round's rows share one timing row, which joins them into one round, and each request's rounds follow one
    another. That alone does not order two stretches of rounds that share no request (two requests that ended in
    the same round, two new ones admitted in their place), so among the rounds that may come next the one with
    the most requests still queued goes first: the queue only shrinks, and while it holds the same number every
    round runs the same requests."""
    rank = {key: i for i, key in enumerate(queue or [])}

    def joined(rec) -> tuple:
        return (rank[(rec.dataset, rec.prompt_id)],) if queue else (rec.dataset, rec.index)

    nodes: dict[tuple, list] = {}
    order = TopologicalSorter()
    for rec in records:
        prev, pos = None, rec.prompt_len
        for i, (stats, timing) in enumerate(zip(rec.rounds, rec.timings, strict=True)):
            key = tuple(timing)
            nodes.setdefault(key, []).append((rec, i, pos))
            order.add(key, *([prev] if prev is not None else []))
            prev, pos = key, pos + stats[3]

    def queued(key) -> int:
        rec, i, _ = nodes[key][0]
        return rec.waiting[i] if rec.waiting else 0

    order.prepare()
    ready, out = [], []
    while order.is_active():
        ready.extend(order.get_ready())
        key = min(ready, key=lambda k: (-queued(k), min(joined(m[0]) for m in nodes[k])))
        ready.remove(key)
        out.append(sorted(nodes[key], key=lambda m: joined(m[0])))
        order.done(key)
    return out


def replay(records, scheduler: schedulers.HardwareAware, block: int = 7, drafter: str = "dspark",
           queue: list[tuple[str, str]] | None = None) -> list[dict]:
    """One session's rounds (one repeat; ``queue``: :func:`ordered_rounds`), one dict each: ``recorded`` and
    ``planned`` (drafted or not), ``tokens``, ``seconds``, ``rows`` and, where the plan weighed drafting, its
    numbers."""
    out, last = [], None
    for n, members in enumerate(ordered_rounds(records, queue)):
        slots = [SimpleNamespace(request_id=(rec.dataset, rec.prompt_id), position=pos) for rec, _, pos in members]
        ctx = DraftContext(None, 1.0, block, slots, drafter=drafter, last_round=last, reports_rounds=True)
        planned = scheduler.plan(ctx)
        rows = len(slots)
        row = {"round": n, "rows": rows, "planned": planned}
        if scheduler.last_promise is not None:  # the plan weighed drafting against a vanilla step
            first = min(float(scheduler._expected_survival(ctx)[0][0] * scheduler.kappa()), 1.0)
            row.update(promise=scheduler.last_promise, kappa=scheduler.kappa(), first=first,
                       factors={p: round(v, 3) for (r, p), v in scheduler._factors.items() if r == rows})
        stats = [rec.rounds[i] for rec, i, _ in members]
        timing = members[0][0].timings[members[0][1]]
        recorded = any(s[0] for s in stats)
        if recorded:
            lengths = torch.tensor([s[0] for s in stats])
            conf = None
            if all(rec.confidence is not None for rec, _, _ in members):  # else a drafter without confidences
                conf = torch.zeros(rows, int(lengths.max()), dtype=torch.float64)
                for j, (rec, i, _) in enumerate(members):
                    conf[j, : len(rec.confidence[i])] = torch.tensor(rec.confidence[i], dtype=torch.float64)
            proposal = Proposal(torch.zeros(rows, int(lengths.max()), dtype=torch.long), lengths, None, conf)
        else:
            proposal = Proposal.empty(rows)
        scheduler.decide(proposal, ctx)
        verified, accepted = [s[1] for s in stats], [s[2] for s in stats]
        scheduler.observe(ctx, verified, accepted)
        last = RoundTiming((last.index if last else 0) + 1, rows, tuple(1 + v for v in verified),
                           float(np.mean([s.position for s in slots])), recorded, timing[0], timing[1], timing[2])
        row.update(recorded=recorded, tokens=sum(s[3] for s in stats), seconds=float(sum(timing[:3])))
        out.append(row)
    return out


def replay_lines(run: Path, profile: str, calibration: str | None = None, repeats: tuple[int, ...] = (0,),
                 layout: str = "padded"):
    """The lines ``dspark-bench study sched-replay`` prints: one per round of each repeat (replayed in order through one
    scheduler, a session per repeat), then how many decisions agree."""
    records = read_records(run)
    queue = [(p["dataset"], p["prompt_id"]) for p in read_manifest(run).get("prompts", [])] or None
    scheduler = schedulers.create_scheduler("hardware-aware", layout=layout, profile=profile,
                                            calibration=calibration)
    agree, total = 0, 0
    for repeat in repeats:
        rows = replay([r for r in records if r.repeat == repeat], scheduler, queue=queue)
        for r in rows:
            plan = (f"promise {r['promise']:.3f} kappa {r['kappa']:.3f} first {r['first']:.2f} "
                    f"{r['factors']}") if "promise" in r else ""
            yield (f"r{repeat} {r['round']:4d} R={r['rows']:<2d} engine {'D' if r['recorded'] else '.'} "
                   f"replay {'D' if r['planned'] else '.'} {r['tokens']:3d} tok {r['seconds'] * 1000:6.1f} ms  {plan}")
        agree += sum(r["recorded"] == r["planned"] for r in rows)
        total += len(rows)
    yield f"decisions that agree: {agree} of {total}"

"""SIMULATED throughput at scale: replay recorded rounds against an SPS table. Nothing here runs a model.

**Traces.** Each recorded request of a full-verification run (scheduler ``fixed``) gives, per round, the
number of draft tokens verified ``v``, the leading survivors ``A`` among them and the drafter's confidences.
Replaying a round under a scheduler that verifies ``l <= v`` of them gives ``min(A, l)`` accepted tokens and
one target token, exactly as the engine would on that round (acceptance of x_j depends only on x_1..x_j).
Later rounds are replayed as recorded (a request cycles through its rounds until it has produced as many
decode tokens as it did when recorded): the approximation is that a round's outcome does not depend on which
tokens earlier rounds committed.

**Clock.** A step of R requests costs ``draft(R) + other(R) + s * verify``. ``verify`` is the profile's
forward seconds of the shape the target computes (``layout``: ``padded`` = this engine, R rows of
``1 + max l`` tokens, from the profile's verify grid when it has one; ``packed`` = ``1 / SPS(sum (1 + l))``)
at the active requests' mean context. ``draft(R)`` and ``other(R)`` are least-squares lines ``a + b R`` of
the recorded ``draft_s`` and ``other_s`` per round (0 without timings); ``draft`` is paid only in rounds where
the scheduler's ``plan`` lets the drafter run. ``s`` (``clock_scale``) is the recorded verify seconds over the
profile's prediction, summed over the replayed cell's drafted rounds (a shared machine's load level; 1 for a
dedicated one); a round that verifies no draft token takes ``plain_clock_scale``, the same ratio over the
vanilla steps of the level's `none` cell (:func:`clock_scales` says why). Prefill is not
simulated (decode only, as ``sweep.aggregate_tokens_per_s``). Continuous batching: a finished request's slot is
refilled at once.

**What the first simulation got wrong** (13-30 % too high where few tokens were verified, on the old engine):
three things, all changed since. (1) It priced a verify of R rows x w tokens as ``1 / SPS(R w)`` from a profile
measured on as few rows as possible (B tokens as ``ceil(B / 8)`` rows: one row of 8 tokens for 8 rows of one);
the verify grid measures the engine's own shapes (on the 2026-12-01 CPU sweep: 5.0 % mean absolute error with
the grid, 7.3 % with the old model, ``simulate --verify-model sps``). (2) The old engine's batches drained as
requests finished while the simulation refilled them at once; the engine now holds its batch. (3) The
scheduler's own time fell inside the recorded verify seconds; the engine now books it under ``other_s``.

The schedulers are the real ones (:func:`~dspark_bench.scheduling.schedulers.create_scheduler`), fed fake proposals and
told each simulated round's verified and accepted counts (``observe``) and its seconds (``ctx.last_round``), as in
the engine, so a scheduler that adapts its prices (``adapt``) learns the simulated clock's as it would the
engine's.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark_bench.core.records import RequestRecord
from dspark_bench.drafters.base import DraftContext, Proposal, RoundTiming
from dspark_bench.evaluation.metrics import decode_tokens
from dspark_bench.scheduling.profile import Profile, load_profile
from dspark_bench.scheduling.schedulers import create_scheduler, scheduler_class
from dspark_bench.studies.sweep import read_cell


@dataclass(frozen=True)
class Trace:
    """One recorded request: per round verified v, accepted A and confidences c_1..c_v (or None)."""

    verified: tuple[int, ...]
    accepted: tuple[int, ...]
    confidence: tuple[tuple[float, ...], ...] | None
    tokens: int  # decode tokens it produced
    prompt_len: int


def traces_from_records(records: Sequence[RequestRecord]) -> list[Trace]:
    out = []
    for rec in records:
        if not rec.ok or not rec.rounds:
            continue
        ver = tuple(r[1] for r in rec.rounds)
        conf = None if rec.confidence is None else tuple(c[:v] for c, v in zip(rec.confidence, ver, strict=True))
        out.append(Trace(ver, tuple(r[2] for r in rec.rounds), conf, decode_tokens(rec), rec.prompt_len))
    return out


@dataclass(frozen=True)
class RoundFit:
    """Per-round seconds outside the target's forward, as lines ``a + b R``: ``draft`` (the drafter's propose,
    paid only when it runs), ``other`` (scheduling, acceptance, commit) and ``plain``, ``other`` for a round that
    verifies no draft token (``other`` where none was measured)."""

    draft: tuple[float, float] = (0.0, 0.0)
    other: tuple[float, float] = (0.0, 0.0)
    plain: tuple[float, float] | None = None

    def seconds(self, rows: int, drafted: bool, width: int = 1) -> float:
        """A round of ``rows`` requests verifying up to ``width`` draft tokens each."""
        (da, db), (oa, ob) = self.draft, (self.plain if width == 0 and self.plain is not None else self.other)
        return oa + ob * rows + ((da + db * rows) if drafted else 0.0)


def fit_overhead(records: Sequence[RequestRecord], plain: Sequence[RequestRecord] = ()) -> RoundFit:
    """Least-squares lines of the recorded ``draft_s`` and ``other_s`` per round against the batch size R: ``other``
    over the rounds of ``records`` that verified a draft token, ``plain`` over the rounds, of ``records`` and of
    ``plain`` (a ``none`` cell's, say), that verified none. A round's records share its timing row exactly, which
    joins them into the round. (Before 9c47dc5, 2026-12-03, one line priced every round: fitted on ``fixed`` (7)
    rounds, it priced a vanilla step's acceptance as a 7-draft one's, and the simulation ran `hardware-aware`
    8-14% slow at R = 16-32, where it never drafted.)"""
    rounds: dict[tuple, list] = {}
    for source, rec in [(0, r) for r in records] + [(1, r) for r in plain]:
        for t, b, stats in zip(rec.timings, rec.batch or (1,) * len(rec.timings), rec.rounds, strict=True):
            entry = rounds.setdefault((source, *t), [b, 0, t[0], t[2], source])
            entry[1] = max(entry[1], stats[1])
    own = [e for e in rounds.values() if e[4] == 0]
    drafted = [e for e in own if e[1] > 0]
    vanilla = [e for e in rounds.values() if e[1] == 0]
    fit = RoundFit(_line([e[0] for e in own], [e[2] for e in own]), _line([e[0] for e in drafted], [e[3] for e in drafted]))
    if not drafted:  # a none cell's own records: every round is plain
        return dataclasses.replace(fit, other=_line([e[0] for e in vanilla], [e[3] for e in vanilla]))
    return dataclasses.replace(fit, plain=_line([e[0] for e in vanilla], [e[3] for e in vanilla]) if vanilla else None)


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    if len(set(xs)) < 2:
        return float(np.mean(ys)) / 2, float(np.mean(ys)) / (2 * xs[0])  # split evenly: no slope information
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


@dataclass(eq=False)
class _SimSlot:
    """What schedulers read from an engine slot: its request id, its position and its identity."""

    request_id: int
    position: int


@dataclass(eq=False)
class _Live:
    trace: Trace
    slot: _SimSlot
    round: int  # index into the trace's rounds (cycled)
    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class SimSpec:
    scheduler: str
    concurrency: int
    options: dict[str, Any] = field(default_factory=dict)
    layout: str = "padded"  # what the target computes: padded (this engine) or packed
    block_size: int = 7
    clock_scale: float = 1.0  # measured / profiled verify time on the machine being simulated ...
    plain_scale: float | None = None  # ... and of a round that verifies no draft token (None: clock_scale)
    decisions: Profile | None = None  # the SPS table the schedulers decide with (default: the clock's)
    drafter: str = ""  # the drafter's name, under which a scheduler looks up its cost in the profile


def simulate(traces: Sequence[Trace], spec: SimSpec, profile: Profile, overhead: RoundFit = RoundFit(),
             n_requests: int | None = None) -> dict[str, Any]:
    """Replay ``n_requests`` (default: every trace once; more cycle through the traces with shifted starting
    rounds) at ``spec.concurrency`` and return the sweep-row metrics, labelled simulated."""
    n = n_requests or len(traces)
    queue = deque(_Live(traces[i % len(traces)], _SimSlot(i, traces[i % len(traces)].prompt_len),
                        (7 * (i // len(traces))) % len(traces[i % len(traces)].verified)) for i in range(n))
    scheduler = create_scheduler(spec.scheduler, **_options(spec, profile))
    live: list[_Live] = []
    done: list[_Live] = []
    totals = np.zeros(5)  # rounds, committed, verified, accepted, seconds
    last: RoundTiming | None = None  # the previous simulated round, as the engine reports it to the scheduler
    while queue or live:
        while queue and len(live) < spec.concurrency:
            live.append(queue.popleft())
        step, last = _step(live, scheduler, spec, profile, overhead, last)
        totals += step
        done += [item for item in live if item.tokens >= item.trace.tokens]
        live = [item for item in live if item.tokens < item.trace.tokens]
    return _row(spec, totals, done)


def _options(spec: SimSpec, profile: Profile) -> dict[str, Any]:
    """The scheduler's own options plus, where it takes one, the simulated profile. (``spec.layout`` is what
    the simulated target computes; the scheduler's own ``layout`` option is what it assumes.)"""
    cls = scheduler_class(spec.scheduler)
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return {"profile": spec.decisions or profile, **spec.options} if "profile" in names else dict(spec.options)


def _step(live: list[_Live], scheduler, spec: SimSpec, profile: Profile, overhead: RoundFit,
          last: RoundTiming | None) -> tuple[np.ndarray, RoundTiming]:
    """One simulated engine round: [1 round per request, committed, verified, accepted, seconds] and its timing
    (``last``: the previous round's, which the scheduler may learn its prices from, as from the engine)."""
    ctx = DraftContext(None, 1.0, spec.block_size, [item.slot for item in live], drafter=spec.drafter,
                       last_round=last, reports_rounds=True)
    drafted = scheduler.plan(ctx)
    # 1. the recorded round of each request, as a proposal (none when the scheduler skips the drafter)
    idx = [item.round % len(item.trace.verified) for item in live]
    proposal = _proposal(live, idx) if drafted else Proposal.empty(len(live))
    # 2. schedule (capped by each request's remaining budget, as the engine does) and clock
    chosen = scheduler.decide(proposal, ctx).tolist()
    ver = [max(min(c, item.trace.tokens - item.tokens - 1), 0) for c, item in zip(chosen, live, strict=True)]
    rows = len(live)
    context = float(np.mean([item.slot.position for item in live]))
    if spec.layout == "padded":
        verify = float(profile.verify_seconds(rows, 1 + max(ver), context))
    else:
        verify = 1.0 / float(profile.sps(rows + sum(ver), context))
    draft_s = overhead.seconds(rows, True) - overhead.seconds(rows, False) if drafted else 0.0
    timing = RoundTiming((last.index if last else 0) + 1, rows, tuple(1 + v for v in ver), context, drafted,
                         draft_s, _scale(spec, max(ver, default=0)) * verify,
                         overhead.seconds(rows, False, max(ver, default=0)))
    seconds = draft_s + timing.other_s + timing.verify_s
    # 3. accept and commit (a skipped round keeps its recorded round for the next time the drafter runs)
    acc = [min(item.trace.accepted[i], v) for item, i, v in zip(live, idx, ver, strict=True)]
    scheduler.observe(ctx, ver, acc)
    for item, a in zip(live, acc, strict=True):
        item.tokens += a + 1
        item.slot.position += a + 1
        item.round += int(drafted)
        item.seconds += seconds
    return np.array([rows, sum(acc) + rows, sum(ver), sum(acc), seconds]), timing


def _scale(spec: SimSpec, width: int) -> float:
    """The clock scale of a simulated round verifying up to ``width`` draft tokens per request."""
    return spec.plain_scale if width == 0 and spec.plain_scale is not None else spec.clock_scale


def _proposal(live: list[_Live], idx: list[int]) -> Proposal:
    lengths = torch.tensor([item.trace.verified[i] for item, i in zip(live, idx, strict=True)], dtype=torch.long)
    width = int(lengths.max()) if len(live) else 0
    conf = None
    if all(item.trace.confidence is not None for item in live):
        conf = torch.zeros(len(live), width, dtype=torch.float64)
        for r, (item, i) in enumerate(zip(live, idx, strict=True)):
            conf[r, : lengths[r]] = torch.tensor(item.trace.confidence[i], dtype=torch.float64)
    return Proposal(torch.zeros(len(live), width, dtype=torch.long), lengths, None, conf)


def _row(spec: SimSpec, totals: np.ndarray, done: list[_Live]) -> dict[str, Any]:
    rounds, committed, verified, accepted, seconds = totals
    tokens = sum(min(item.tokens, item.trace.tokens) for item in done)
    per_request = tokens / sum(item.seconds for item in done) if done else None
    return {"simulated": True, "scheduler": spec.scheduler, "concurrency": spec.concurrency,
            "options": spec.options, "layout": spec.layout, "clock_scale": spec.clock_scale,
            "plain_clock_scale": spec.plain_scale,
            "aggregate_tokens_per_s": tokens / seconds if seconds else None, "per_request_tps": per_request,
            "mean_verify_budget": 1 + verified / rounds if rounds else None,
            "waste": (verified - accepted) / verified if verified else None,
            "tau": committed / rounds if rounds else None, "n_requests": len(done)}


# ---- projection and validation --------------------------------------------------------------------------------
def project(traces: Sequence[Trace], profile: Profile, cells: Sequence[tuple[str, dict]], concurrency: Sequence[int],
            layout: str = "padded", overhead: RoundFit = RoundFit(), block_size: int = 7,
            scale: float = 1.0, drafter: str = "", plain_scale: float | None = None) -> list[dict]:
    """Every (scheduler, options) at every concurrency, with max(len(traces), 2 N) requests per level."""
    rows = []
    for conc in concurrency:
        for name, options in cells:
            spec = SimSpec(name, conc, dict(options), layout, block_size, scale, plain_scale, drafter=drafter)
            rows.append(simulate(traces, spec, profile, overhead, max(len(traces), 2 * conc)))
    return rows


def verify_pairs(records: Sequence[RequestRecord], profile: Profile,
                 layout: str = "padded") -> list[tuple[float, float, bool]]:
    """(recorded verify_s, the profile's price of its shape, whether it verified a draft token) per engine round:
    rounds are rebuilt by grouping requests' rounds with identical timing rows (one engine round shares one
    timing row)."""
    groups: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # timing row -> [(verified, context)]
    for rec in records:
        context = rec.prompt_len + 1
        for (_, ver, _, com), t in zip(rec.rounds, rec.timings, strict=True):
            groups[tuple(t)].append((ver, context))
            context += com
    pairs = []
    for timing, members in groups.items():
        ver, context = [v for v, _ in members], float(np.mean([c for _, c in members]))
        if layout == "padded":
            predicted = float(profile.verify_seconds(len(ver), 1 + max(ver), context))
        else:
            predicted = 1.0 / float(profile.sps(len(ver) + sum(ver), context))
        pairs.append((float(timing[1]), predicted, max(ver) > 0))
    return pairs


def verify_ratios(records: Sequence[RequestRecord], profile: Profile, layout: str = "padded") -> list[float]:
    """Recorded verify_s of each engine round / the profile's price of its shape (:func:`verify_pairs`)."""
    return [recorded / predicted for recorded, predicted, _ in verify_pairs(records, profile, layout)]


def clock_scale(records: Sequence[RequestRecord], profile: Profile, layout: str = "padded",
                drafted: bool | None = None) -> float | None:
    """Recorded / profiled verify seconds, summed over the rounds of ``records`` (only those that verified a
    draft token, or only those that verified none, where ``drafted`` says which); None where there is no such
    round. A ratio of sums, not the median of each round's ratio: throughput is tokens over total seconds, and a
    machine's slow stretches weigh in the total, where the median left them out."""
    pairs = [(r, p) for r, p, d in verify_pairs(records, profile, layout) if drafted is None or d == drafted]
    predicted = sum(p for _, p in pairs)
    return sum(r for r, _ in pairs) / predicted if predicted > 0 else None


def clock_scales(records: Sequence[RequestRecord], profile: Profile, layout: str = "padded",
                 vanilla: Sequence[RequestRecord] = ()) -> tuple[float, float]:
    """(drafted rounds' scale, vanilla steps' scale) for a replay of ``records`` (a fixed cell's). Vanilla steps
    are off their price by another factor than multi-token verifies (sweep of 2026-12-03, 5754b7b: at R = 32 the
    `none` cell's steps ran at 2.02x their price, the fixed cell's verifies at 1.52x), so a simulated round that
    verifies no draft token is priced by the vanilla records' scale (``vanilla``: the level's `none` cell), else
    by the plain rounds of ``records``, else as a drafted one. 1 where there is nothing to measure."""
    drafted = clock_scale(records, profile, layout, True) or clock_scale(records, profile, layout) or 1.0
    plain = clock_scale(vanilla, profile, layout, False) or clock_scale(records, profile, layout, False) or drafted
    return drafted, plain


def verify_model_error(records: Sequence[RequestRecord], profile: Profile, layout: str = "padded") -> dict:
    """|recorded / predicted verify time - 1| per engine round, raw and after the median clock scale."""
    ratios = np.asarray(verify_ratios(records, profile, layout))
    if not len(ratios):
        return {"rounds": 0}
    scale = float(np.median(ratios))
    return {"rounds": len(ratios), "clock_scale": scale,
            "median_abs_rel_error_raw": float(np.median(np.abs(ratios - 1))),
            "median_abs_rel_error_scaled": float(np.median(np.abs(ratios / scale - 1)))}


_COMPARED = ("aggregate_tokens_per_s", "per_request_tps", "mean_verify_budget", "tau", "waste")


def validate(sweep_dir: str | Path, profile: Profile, layout: str = "padded", block_size: int = 7) -> dict:
    """Simulate every measured sweep cell from the ``fixed`` cell of the same drafter and concurrency: its
    traces, overhead fit and clock scale, with decisions made on the SPS table the sweep used. Reports the
    relative errors of the metrics and of each cell's throughput ratio to fixed, over all cells and over the cells
    predicted from another cell's records (``replays_itself``: the ``fixed`` cells, ``none``'s included, are
    replayed from their own records and clock, so their errors say little about the simulation)."""
    sweep_dir = Path(sweep_dir)
    sweep = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    rows, decisions = sweep["rows"], load_profile(sweep["profile"]) if sweep.get("profile") else None
    out, read = [], {}

    def cell(folder: str) -> list[RequestRecord]:  # each cell's records read once, though several rows use them
        if folder not in read:
            read[folder] = read_cell(sweep_dir / folder)
        return read[folder]

    for row in rows:
        base = next((b for b in rows if b["label"] == "fixed" and b["drafter"] == row["drafter"]
                     and b["concurrency"] == row["concurrency"]), None)
        if base is None:
            continue
        records = cell(base["folder"])
        vanilla = next((cell(b["folder"]) for b in rows if b["drafter"] == "none"
                        and b["concurrency"] == row["concurrency"] and base["drafter"] != "none"), ())
        sim = _replay(row, records, profile, layout, block_size, decisions, vanilla)
        ratio = {"measured": _ratio(row, base),
                 "simulated": _ratio(sim, _replay(base, records, profile, layout, block_size, decisions, vanilla))}
        errors = {k: _rel(sim[k], row[k]) for k in _COMPARED}
        out.append({"drafter": row["drafter"], "label": row["label"], "concurrency": row["concurrency"],
                    "replays_itself": base is row, "clock_scale": sim["clock_scale"],
                    "plain_clock_scale": sim["plain_clock_scale"], "measured": {k: row[k] for k in _COMPARED},
                    "simulated": {k: sim[k] for k in _COMPARED}, "ratio_vs_fixed": ratio,
                    "rel_error": {**errors, "ratio_vs_fixed": _rel(ratio["simulated"], ratio["measured"])}})
    return {"rows": out, **validation_errors(out)}


def _replay(cell: dict, records: Sequence[RequestRecord], profile: Profile, layout: str, block_size: int,
            decisions: Profile | None, vanilla: Sequence[RequestRecord] = ()) -> dict:
    """A sweep cell replayed from ``records`` (the fixed cell): their traces, overhead fit (vanilla steps' from
    ``vanilla``, the level's `none` cell, where there is one) and clock scales (:func:`clock_scales`)."""
    spec = SimSpec(cell["scheduler"], cell["concurrency"], dict(cell["options"]), layout, block_size,
                   *clock_scales(records, profile, layout, vanilla), decisions, drafter=cell["drafter"])
    return simulate(traces_from_records(records), spec, profile, fit_overhead(records, vanilla))


def _ratio(row: dict, base: dict) -> float | None:
    a, b = row["aggregate_tokens_per_s"], base["aggregate_tokens_per_s"]
    return a / b if a and b else None


def validation_errors(rows: Sequence[dict]) -> dict[str, dict[str, float | None]]:
    """Mean absolute relative errors over all validated cells and over those predicted from another's records."""
    return {"mean_abs_rel_error": mean_abs_errors(rows),
            "mean_abs_rel_error_predicted": mean_abs_errors([r for r in rows if not r["replays_itself"]])}


def mean_abs_errors(rows: Sequence[dict]) -> dict[str, float | None]:
    return {k: _mean_abs([r["rel_error"][k] for r in rows]) for k in (*_COMPARED, "ratio_vs_fixed")}


def _rel(sim: float | None, measured: float | None) -> float | None:
    return None if sim is None or not measured else (sim - measured) / measured


def _mean_abs(values: Sequence[float | None]) -> float | None:
    vals = [abs(v) for v in values if v is not None]
    return float(np.mean(vals)) if vals else None

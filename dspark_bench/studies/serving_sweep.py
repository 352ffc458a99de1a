"""The paper's serving claims from a request-rate sweep: pure functions over each method's serving numbers per rate.

A *method* is a drafter under a scheduler (``"none fixed"``, ``"dspark fixed"``, ``"dspark hardware-aware"``);
a :class:`RatePoint` is what one method did at one offered request rate, on the same seeded arrival schedule as
every other method at that rate (the sweep's cell; numbers from :mod:`dspark_bench.evaluation.serving`):
``system`` = ``output_throughput`` (output tokens / the run's span), ``per_user`` = ``per_user_tokens_per_s``
(1000 / mean TPOT), ``p90_tpot_ms``. Two comparisons with the baseline method (``none``):

1. **Per-user tokens/s at equal system throughput** (the paper's "+60% to +85% TPS at matched throughput").
   Each method's operating points trace per-user against system tokens/s as the rate grows. Its *frontier* is
   the points no other of its points beats on both (ascending system tokens/s, descending per-user): the best
   per-user rate it offers at that throughput or more. Per-user tokens/s at a system throughput x is the linear
   interpolation along the frontier. The ratio method / baseline is reported at every frontier throughput of
   either method that both frontiers span (no extrapolation), with its smallest and largest value.
2. **The highest rate sustained under a TPOT SLO** (``--slo tpot=MS``), at p90: walking up the rates, the first
   rate whose p90 TPOT exceeds the bound (or that lost a request) ends the walk; the sustained rate is where p90
   TPOT crosses the bound by linear interpolation between that rate and the one below it (the one below it when
   the walk ended on lost requests). Every rate met the SLO:
   the highest measured rate, a lower bound (``at_least``); the lowest rate already missed it: ``below_range``
   (no rate). The ratio to the baseline's is exact when both crossed within the sweep, a lower bound when only
   the method did not cross, an upper bound when only the baseline did not, and withheld otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BASELINE = "none fixed"
# The serving numbers of a request-rate cell in sweep.json (evaluation.serving's names).
SERVING_ROW = ("request_throughput", "output_throughput", "per_user_tokens_per_s", "median_ttft_ms", "p90_ttft_ms",
               "median_tpot_ms", "p90_tpot_ms", "p90_itl_ms", "median_e2el_ms", "p90_e2el_ms", "mean_queue_ms",
               "request_goodput")


@dataclass(frozen=True)
class RatePoint:
    method: str
    rate: float  # offered requests/s
    system: float | None  # output tokens/s of the whole run
    per_user: float | None  # tokens/s of one user's stream
    p90_tpot_ms: float | None
    failed: int = 0


@dataclass(frozen=True)
class EqualThroughput:
    system: float
    per_user: float
    base_per_user: float
    ratio: float


@dataclass(frozen=True)
class Sustained:
    rate: float | None  # requests/s; None when even the lowest rate missed the SLO
    bound: str  # "interpolated", "at_least" or "below_range"


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline (module docstring)."""

    method: str
    equal_throughput: tuple[EqualThroughput, ...]
    ratio_min: float | None
    ratio_max: float | None
    sustained: Sustained | None  # None without a TPOT SLO
    base_sustained: Sustained | None
    rate_ratio: float | None
    rate_ratio_kind: str | None  # "exact", "lower_bound", "upper_bound"


def method_of(row: Mapping) -> str:
    """A sweep row's method name: drafter and scheduler label."""
    return f"{row['drafter']} {row['label']}"


def points_from_rows(rows: Sequence[Mapping]) -> list[RatePoint]:
    """The request-rate rows of a sweep (``sweep.json``) as points."""
    return [RatePoint(method_of(r), float(r["request_rate"]), r.get("output_throughput"),
                      r.get("per_user_tokens_per_s"), r.get("p90_tpot_ms"), int(r.get("n_errors") or 0))
            for r in rows if r.get("request_rate") is not None]


def frontier(points: Sequence[RatePoint]) -> tuple[tuple[float, float], ...]:
    """(system, per-user) of the points no other point beats on both, by ascending system tokens/s."""
    pts = sorted(((p.system, p.per_user) for p in points if p.system is not None and p.per_user is not None),
                 key=lambda t: (-t[0], -t[1]))
    kept, best = [], -np.inf
    for x, y in pts:  # from the highest throughput down: keep what beats every point to its right
        if y > best:
            kept.append((x, y))
            best = y
    return tuple(reversed(kept))


def per_user_at(front: Sequence[tuple[float, float]], system: float) -> float:
    """Per-user tokens/s at ``system`` tokens/s, linear along a frontier (within its span)."""
    xs, ys = zip(*front, strict=True)
    return float(np.interp(system, xs, ys))


def equal_throughput(method: Sequence[RatePoint], base: Sequence[RatePoint]) -> tuple[EqualThroughput, ...]:
    """Per-user tokens/s of ``method`` and ``base`` at every frontier throughput of either within both spans."""
    fm, fb = frontier(method), frontier(base)
    if not fm or not fb:
        return ()
    lo, hi = max(fm[0][0], fb[0][0]), min(fm[-1][0], fb[-1][0])
    xs = sorted({x for x, _ in (*fm, *fb) if lo <= x <= hi})
    out = []
    for x in xs:
        mine, theirs = per_user_at(fm, x), per_user_at(fb, x)
        out.append(EqualThroughput(x, mine, theirs, mine / theirs if theirs > 0 else float("nan")))
    return tuple(out)


def sustained_rate(points: Sequence[RatePoint], tpot_ms: float) -> Sustained | None:
    """The highest rate whose p90 TPOT stays within ``tpot_ms`` (module docstring); None without points."""
    pts = sorted(points, key=lambda p: p.rate)
    if not pts:
        return None

    def meets(p: RatePoint) -> bool:
        return p.failed == 0 and (p.p90_tpot_ms is None or p.p90_tpot_ms <= tpot_ms)

    first_miss = next((i for i, p in enumerate(pts) if not meets(p)), None)
    if first_miss is None:
        return Sustained(pts[-1].rate, "at_least")
    if first_miss == 0:
        return Sustained(None, "below_range")
    below, above = pts[first_miss - 1], pts[first_miss]
    t0, t1 = below.p90_tpot_ms, above.p90_tpot_ms
    if above.failed or t0 is None or t1 is None or t1 <= tpot_ms:  # it lost requests: no TPOT crossing
        return Sustained(below.rate, "interpolated")
    return Sustained(below.rate + (tpot_ms - t0) * (above.rate - below.rate) / (t1 - t0), "interpolated")


def rate_ratio(mine: Sustained | None, base: Sustained | None) -> tuple[float | None, str | None]:
    """Sustained rate over the baseline's, and what kind of number that is (module docstring)."""
    if mine is None or base is None or mine.rate is None or base.rate is None or base.rate <= 0:
        return None, None
    kinds = {("interpolated", "interpolated"): "exact", ("at_least", "interpolated"): "lower_bound",
             ("interpolated", "at_least"): "upper_bound"}
    kind = kinds.get((mine.bound, base.bound))
    return (mine.rate / base.rate, kind) if kind else (None, None)


def compare(points: Sequence[RatePoint], tpot_slo_ms: float | None, baseline: str = BASELINE) -> list[Comparison]:
    """Every method but ``baseline`` against it; nothing when the baseline was not swept."""
    by_method: dict[str, list[RatePoint]] = {}
    for p in points:
        by_method.setdefault(p.method, []).append(p)
    base = by_method.get(baseline)
    if not base:
        return []
    base_sustained = sustained_rate(base, tpot_slo_ms) if tpot_slo_ms else None
    out = []
    for method, pts in by_method.items():
        if method == baseline:
            continue
        equal = equal_throughput(pts, base)
        ratios = [e.ratio for e in equal if np.isfinite(e.ratio)]
        sustained = sustained_rate(pts, tpot_slo_ms) if tpot_slo_ms else None
        out.append(Comparison(method, equal, min(ratios, default=None), max(ratios, default=None), sustained,
                              base_sustained, *rate_ratio(sustained, base_sustained)))
    return out

"""Every metric, defined once. Pure functions over :class:`~dspark_bench.core.records.RequestRecord` lists.

Per round we record ``proposed`` (draft tokens offered), ``verified`` (l, sent to the target), ``accepted``
(A, leading survivors) and ``committed`` (tokens appended: A + 1, or A when an accepted EOS ended the request).

* **tau** (accepted length, the paper's tau) = sum(committed) / rounds, pooled over all rounds of all
  requests (a micro-average; includes the bonus/recovered token, so vanilla decoding has tau = 1).
* **acceptance_rate** = sum(accepted) / sum(proposed).
* **verify_efficiency** = sum(committed) / sum(verified + 1): share of verified slots that were committed.
* **waste** = sum(verified - accepted) / sum(verified): verified draft tokens that were rejected.
* Per draft position j = 1..gamma, integer counts:
  ``verified[j]`` = #rounds with l >= j (proposals that reached position j);
  ``examined[j]`` = #rounds with l >= j and A >= j-1 (the verifier actually tested x_j);
  ``accepted[j]`` = #rounds with A >= j. Three rates derive from them:
  **marginal_survival**[j] = accepted[j] / rounds (vLLM's per-position rate);
  **survival_reached**[j] = accepted[j] / verified[j] (DeepSpec's accept_rate@j);
  **conditional**[j] = accepted[j] / examined[j] (the paper's Figure 2: P(x_j survives | x_1..x_{j-1} did)).
* **histogram**[a] = #rounds with A = a, a = 0..gamma.
Time definitions (the same for every drafter; round fields in :mod:`dspark_bench.core.rounds`):

* **prefill** (``ttft_s``): admission to the first token: the target's prefill, the first draw and the
  drafter's prompt processing (``begin``). **decode** (``decode_s``): the sum of the request's rounds' wall
  times ``round_s = draft_s + verify_s + other_s``. Decode tokens = output length - 1 (the first token is
  prefill's).
* **per_request_tokens_per_s** (reported as ``tokens_per_s``) = sum(decode tokens) / sum(decode_s): the rate a
  request sees. **tpot_s** per request = decode_s / decode tokens.
* **system_tokens_per_s** = sum(decode tokens) / decode wall time of the batch, where a round of batch b
  appears in b records, so the wall time is sum over request-rounds of round_s / b (each round counted once).
* Shares of decode wall time, over rounds counted once (weights 1 / b): **overhead_share** = non-forward
  time / round time = sum(round_s - verify_s - draft_forward_s) / sum(round_s) (everything but the target's
  and the drafter's model forwards: sampling, acceptance, scheduling, bookkeeping); **markov_head_share** =
  sum(head_s) / sum(round_s) (DSpark's Markov head compute, apart from sampling); **sample_share** =
  sum(sample_s) / sum(round_s) (the drafter's draws). None for records without the split timings.
* **mean_batch** = rounds-weighted mean batch size = sum(1) / sum(1 / b) over request-rounds;
  **mean_batch_queued** the same over the rounds during which requests were still queued (continuous batching
  should hold it at the concurrency R), and **occupancy** = mean_batch_queued / R.
* **speedup_vs_none** = tokens_per_s(drafter) / tokens_per_s(none) on the same prompts and repeat, measured in
  the same invocation (a ratio of TPOTs pooled over requests); the median over repeats is reported.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # records are only read here; results imports this module to summarise merged runs
    from dspark_bench.core.records import RequestRecord


@dataclass(frozen=True)
class Counts:
    rounds: int
    committed: int
    proposed: int
    verified: int
    accepted: int
    verified_at: tuple[int, ...]
    examined_at: tuple[int, ...]
    accepted_at: tuple[int, ...]
    histogram: tuple[int, ...]


def count_rounds(rounds: Iterable[Sequence[int]], gamma: int) -> Counts:
    """Integer counts over rounds given as [proposed, verified, accepted, committed]."""
    arr = np.asarray(list(rounds), dtype=np.int64).reshape(-1, 4)
    prop, ver, acc, com = arr.T
    j = np.arange(1, gamma + 1)[:, None]  # [gamma, 1]
    return Counts(
        rounds=int(arr.shape[0]), committed=int(com.sum()), proposed=int(prop.sum()),
        verified=int(ver.sum()), accepted=int(acc.sum()),
        verified_at=tuple(int(x) for x in (ver >= j).sum(1)),
        examined_at=tuple(int(x) for x in ((ver >= j) & (acc >= j - 1)).sum(1)),
        accepted_at=tuple(int(x) for x in (acc >= j).sum(1)),
        histogram=tuple(int(x) for x in np.bincount(np.minimum(acc, gamma), minlength=gamma + 1)),
    )


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def acceptance(c: Counts) -> dict:
    """The acceptance metrics of the module docstring, from counts."""
    return {
        "rounds": c.rounds,
        "tau": _ratio(c.committed, c.rounds),
        "acceptance_rate": _ratio(c.accepted, c.proposed),
        "verify_efficiency": _ratio(c.committed, c.verified + c.rounds),
        "waste": _ratio(c.verified - c.accepted, c.verified),
        "mean_proposed": _ratio(c.proposed, c.rounds),
        "mean_verified": _ratio(c.verified, c.rounds),
        "positions": {
            "verified": list(c.verified_at), "examined": list(c.examined_at), "accepted": list(c.accepted_at),
            "marginal_survival": [_ratio(a, c.rounds) for a in c.accepted_at],
            "survival_reached": [_ratio(a, v) for a, v in zip(c.accepted_at, c.verified_at, strict=True)],
            "conditional": [_ratio(a, e) for a, e in zip(c.accepted_at, c.examined_at, strict=True)],
        },
        "histogram": list(c.histogram),
    }


def decode_tokens(rec: RequestRecord) -> int:
    return max(rec.n_output - 1, 0)


def tokens_per_s(records: Sequence[RequestRecord]) -> float | None:
    """per_request_tokens_per_s (module docstring)."""
    return _ratio(sum(decode_tokens(r) for r in records), sum(r.decode_s for r in records))


per_request_tokens_per_s = tokens_per_s


def _weighted_rounds(records: Sequence[RequestRecord]):
    """(timings row, batch, waiting, 1 / batch) for every request-round."""
    for rec in records:
        batches = rec.batch or (1,) * len(rec.timings)
        waiting = rec.waiting or (0,) * len(rec.timings)
        for t, b, w in zip(rec.timings, batches, waiting, strict=True):
            yield t, b, w, 1.0 / max(b, 1)


def system_tokens_per_s(records: Sequence[RequestRecord]) -> float | None:
    """system_tokens_per_s (module docstring): decode tokens over the batch's decode wall time."""
    wall = sum((t[0] + t[1] + t[2]) * w for t, _, _, w in _weighted_rounds(records))
    return _ratio(sum(decode_tokens(r) for r in records), wall)


def time_shares(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """overhead_share, markov_head_share and sample_share (module docstring); None without split timings."""
    rows = [(t, w) for t, _, _, w in _weighted_rounds(records)]
    total = sum((t[0] + t[1] + t[2]) * w for t, w in rows)
    if not rows or any(len(t) < 6 for t, _ in rows) or not total:
        return {"overhead_share": None, "markov_head_share": None, "sample_share": None}
    return {"overhead_share": sum((t[0] + t[2] - t[4]) * w for t, w in rows) / total,
            "markov_head_share": sum(t[3] * w for t, w in rows) / total,
            "sample_share": sum(t[5] * w for t, w in rows) / total}


def occupancy(records: Sequence[RequestRecord], concurrency: int) -> dict[str, float | None]:
    """mean_batch, mean_batch_queued and occupancy (module docstring)."""
    rows = list(_weighted_rounds(records))
    queued = [(b, w) for _, b, q, w in rows if q > 0]
    mean = _ratio(len(rows), sum(w for *_, w in rows))
    mean_queued = _ratio(len(queued), sum(w for _, w in queued))
    return {"mean_batch": mean, "mean_batch_queued": mean_queued,
            "occupancy": None if mean_queued is None else mean_queued / concurrency}


def percentiles(values: Sequence[float], qs=(50, 90, 99)) -> dict[str, float] | None:
    if not values:
        return None
    return {f"p{q}": float(np.percentile(values, q)) for q in qs}


def tau_bootstrap(records: Sequence[RequestRecord], n_boot: int = 2000, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of tau, resampling prompts (requests) with replacement."""
    per = np.array([[sum(r[3] for r in rec.rounds), len(rec.rounds)] for rec in records if rec.rounds], float)
    if len(per) < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per), size=(n_boot, len(per)))
    sums = per[idx].sum(1)  # [n_boot, 2]
    taus = sums[:, 0] / np.maximum(sums[:, 1], 1)
    lo, hi = np.quantile(taus, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def group_summary(records: Sequence[RequestRecord], gamma: int, baseline: Sequence[RequestRecord] = ()) -> dict:
    """Summary of one drafter on one group of prompts (all repeats); ``baseline`` = ``none`` on the same prompts."""
    ok = [r for r in records if r.ok]
    first = [r for r in ok if r.repeat == min((x.repeat for x in ok), default=0)]
    out = {"n_requests": len({(r.dataset, r.prompt_id) for r in records}),
           "n_errors": sum(not r.ok for r in records)}
    out.update(acceptance(count_rounds((x for r in first for x in r.rounds), gamma)))
    out["tau_ci95"] = tau_bootstrap(first)
    by_rep = _by_repeat(ok)
    base_by_rep = _by_repeat([r for r in baseline if r.ok])
    tps = {k: tokens_per_s(v) for k, v in by_rep.items()}
    out["tokens_per_s_repeats"] = [tps[k] for k in sorted(tps)]
    out["tokens_per_s"] = _median([v for v in tps.values() if v is not None])
    ratios = []
    for rep, recs in by_rep.items():
        keys = {(r.dataset, r.prompt_id) for r in recs}
        base = [b for b in base_by_rep.get(rep, []) if (b.dataset, b.prompt_id) in keys]
        if base and {(b.dataset, b.prompt_id) for b in base} == keys:
            mine, theirs = tokens_per_s(recs), tokens_per_s(base)
            if mine and theirs:
                ratios.append(mine / theirs)
    out["speedup_vs_none_repeats"] = ratios
    out["speedup_vs_none"] = _median(ratios)
    out["ttft_s"] = percentiles([r.ttft_s for r in ok])
    out["tpot_s"] = percentiles([r.decode_s / decode_tokens(r) for r in ok if decode_tokens(r)])
    out["system_tokens_per_s"] = system_tokens_per_s([r for r in ok if r.repeat == min(by_rep, default=0)])
    out.update(time_shares(ok))
    out.update(occupancy(ok, max((r.concurrency for r in records), default=1)))
    return out


def _by_repeat(records: Sequence[RequestRecord]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[r.repeat].append(r)
    return out


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(records: Sequence[RequestRecord], gamma: int) -> dict:
    """Per method x dataset, x domain and x all prompts, where a method is (drafter, scheduler, concurrency).

    The ``none`` baseline for a method is ``none`` at the same concurrency on the same prompts."""
    groups = []
    methods = list(dict.fromkeys((r.drafter, r.scheduler, r.concurrency) for r in records))
    for scope, key in (("dataset", lambda r: r.dataset), ("domain", lambda r: r.domain), ("all", lambda r: "all")):
        names = list(dict.fromkeys(key(r) for r in records))
        for drafter, scheduler, conc in methods:
            for name in names:
                mine = [r for r in records if (r.drafter, r.scheduler, r.concurrency) == (drafter, scheduler, conc)
                        and key(r) == name]
                if not mine:
                    continue
                base = [r for r in records if r.drafter == "none" and r.concurrency == conc and key(r) == name]
                groups.append({"drafter": drafter, "scheduler": scheduler, "concurrency": conc, "scope": scope,
                               "name": name, **group_summary(mine, gamma, base)})
    return {"gamma": gamma, "groups": groups}


def counts_dict(c: Counts) -> dict:
    return asdict(c)


MIN_ROUNDS = 30  # a draft position tested in fewer rounds is marked in tables and left out of figures and decays
WILSON_Z = 1.959964  # 95%


def wilson(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion; None without trials."""
    if trials <= 0:
        return None
    p, zz = successes / trials, z * z
    centre = (p + zz / (2 * trials)) / (1 + zz / trials)
    half = z * math.sqrt(p * (1 - p) / trials + zz / (4 * trials * trials)) / (1 + zz / trials)
    return max(0.0, centre - half), min(1.0, centre + half)

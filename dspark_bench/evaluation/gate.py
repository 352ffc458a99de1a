"""Regression gates: compare a fresh run with a committed baseline; a regression fails CI.

A baseline (``baselines/<NAME>/baseline.json``) stores, per drafter: per domain the per-prompt integer counts
(committed tokens, rounds) behind tau from sampled (temperature > 0) runs, the per-position counts behind the
conditional acceptance, the speedup over ``none`` measured in the same run (per repeat), greedy equality with
``none`` (from temperature-0 runs) and the lossless battery's verdicts (``lossless.json`` in a run folder).

Decision rules:

* **tau** (per drafter, over all domains pooled and per domain): r = tau_new / tau_base. Fail iff r < 1 - tol
  **and** the upper end of r's interval is below 1. The interval is a jackknife over prompts on the log scale
  with a t quantile (:func:`ratio_interval`), paired over the prompts both runs share. The tolerance (default 5%,
  as vLLM's acceptance-length gate) keeps noise from failing; the interval requires the drop to be resolvable at
  the sample size. A scope with fewer than ``min_prompts`` (10) prompts is reported, not judged (with 2-4 prompts
  per domain, an unchanged drafter failed 4 of 10 reruns with other seeds). The first rule's percentile bootstrap
  was too narrow at 10 prompts per domain: unchanged drafters failed 3 of 11 fresh seeds on it (measured;
  ``ratio_interval`` says more). Power is measured, not assumed: ``baselines/smollm2-gate/power.md``.
* **per-position conditional acceptance** (pooled over domains): r_j = rate_new / rate_base at position j. Fail iff
  r_j < 1 - position tol **and** the upper end of r_j's interval (the same jackknife t over prompts) is below 1.
  Rounds of one prompt are correlated (an easy prompt accepts often at every position), so prompts, not rounds,
  are the units (a two-proportion test over pooled rounds would treat them as independent and understate the
  noise). A position reached in fewer than ``min_prompts`` prompts or ``min_examined`` (100) rounds of either run
  is reported, not judged: a weak drafter reaches its deep positions in a handful of rounds, where no interval
  over prompts is trustworthy (measured: an unchanged Eagle3 "failed" accept@7 on 1 round, and an unchanged
  DFlash accept@4 on 3/13 vs 0/13 accepted; Fisher's exact test gives p = 0.11 there).
* **Interval levels**: a gate makes many checks, so each family (the tau checks; the position checks; the speedup
  checks) gets a family-wise error of ``family_alpha`` (2%) split Bonferroni-wise: with m checks, each interval
  is two-sided at 1 - 0.02/m. A check fails only below its interval, so an unchanged set of drafters fails a
  family with chance at most 1%, and the whole gate at most 3% (its goal: at most 1 in 20), leaving
  room for the noise the models miss (the t statistics of unchanged drafters' tau ratios had a spread 1.16 times
  the nominal one, measured on 11 seeds). Without the split, 20 independent tau checks at 95%, each with a
  one-sided false-fail chance of 2.5%, would fail an unchanged drafter set up to 1 - 0.975^20 = 40% of the time.
* **speedup over none** (a ratio measured within each run, never an absolute time): each repeat of a run decodes
  ``none`` and the drafter interleaved, chunk by chunk, so each repeat gives one speedup ratio. On the log scale,
  r = exp(mean log new - mean log base), with a t interval whose spread is estimated from all repeats of the
  baseline (pooled over its seeds) and of the new runs; Bonferroni over the drafters. Fail iff r < 1 - speedup tol
  **and** the upper end of the interval is below 1. With fewer than 2 values in all (no spread to estimate), the
  older rule applies and says so: fail iff every repeat is below base * (1 - tol).
* **errors**: a drafter whose failed requests (records with status other than ``ok``) per run rose above the
  baseline's most in any of its runs fails, whatever the other checks say (they judge ``ok`` records only).
* **present**: a baseline drafter absent from the new runs fails, as does one absent from their temperature-0
  records when the baseline has them.
* **greedy equality** and **lossless verdicts**: any mismatch or failed verdict fails, except a greedy divergence
  from ``none`` that ``run``'s forensics judged floating-point (a near-tie of the target's argmax that a verify
  block and a one-token decode round apart; :mod:`dspark_bench.studies.diverge`); a baseline with lossless
  rows needs a ``lossless.json`` in the new runs, and a baseline with temperature-0 records needs such records
  (else both fail). ``sampled_only`` (for measuring the gate's error rates on sampled reruns) skips these two.
  With it, ``drafters`` may name the drafters to judge: a rerun that decodes only a degraded drafter (and
  ``none``) is judged on exactly the checks the whole gate makes for them, at the whole gate's levels.

**Settings.** A run is judged only against a baseline recorded under the same settings (:data:`GATED_SETTINGS`,
compared by :func:`settings_mismatches` with the baseline's ``sources``): a bf16 run against an fp32 baseline, 16
new tokens against 32 or one domain against all of them measure something else, and their "regressions" are
not regressions. The seed may differ (the gate judges fresh seeds), and so may the repeats (more units of the
same measurement), the drafters and their options (what is judged: ``recipes/gate_power.sh`` degrades a drafter
through its options to measure the gate's power).

A baseline may pool several runs of the same prompts with other seeds (``baseline update RUN1 RUN2 ...``): each
prompt's counts are summed over the runs, so tau and the position rates are pooled estimates, the intervals are
still over prompts (paired with the new run's), and the speedup's spread is seen across seeds.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.metrics import count_rounds
from dspark_bench.evaluation.runs import SUMMARY, UNRECORDED, read_json, read_manifest, read_records

BASELINE_FILE = "baseline.json"
LOSSLESS_FILE = "lossless.json"


class GateError(ValueError):
    """A baseline or run that cannot be compared."""


@dataclass(frozen=True)
class Tolerances:
    tau: float = 0.05
    position: float = 0.10
    speedup: float = 0.20
    family_alpha: float = 0.02  # per family (tau; positions; speedup), split Bonferroni-wise (docstring)
    min_prompts: int = 10  # fewer prompts than this per scope: no interval over prompts is trustworthy
    min_examined: int = 100  # fewer rounds reaching a position: its rate is too coarse for a 10% tolerance

    def __post_init__(self) -> None:
        for name in ("tau", "position", "speedup"):
            value = getattr(self, name)
            if not 0 <= value < 1:  # a drop r < 1 - tol: a negative tol fails unchanged runs, tol >= 1 fails none
                raise GateError(f"{name} tolerance {value}: give a relative drop from 0 up to (not including) 1")
        if not 0 < self.family_alpha < 1 or self.min_prompts < 1 or self.min_examined < 0:
            raise GateError(f"family_alpha {self.family_alpha} (accepted: between 0 and 1), min_prompts "
                            f"{self.min_prompts} (>= 1) or min_examined {self.min_examined} (>= 0) is out of range")


@dataclass(frozen=True)
class Check:
    metric: str
    scope: str
    baseline: float | None
    new: float | None
    interval: str
    verdict: str  # "pass", "fail", or "n/a: reason"

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"


# ---- settings: what a run must share with its baseline ---------------------------------------------------------
# The run settings (manifest ``args``) that change what the gate measures (module docstring, "Settings").
GATED_SETTINGS = ("target", "engine", "engine_options", "dtype", "suite", "limit", "skip", "max_new_tokens",
                  "temperature", "top_p", "top_k", "min_p", "block_size", "concurrency", "warmup", "scheduler",
                  "scheduler_options", "profile")
# Runs of our engine record no engine name; runs from before the sampling filters sampled without them.
_UNRECORDED = {"engine": "dspark", **UNRECORDED}
_MISSING = object()  # a setting a manifest does not record


@dataclass(frozen=True)
class SettingMismatch:
    """A setting in which a run differs from every baseline source run of its kind (sampled or greedy)."""

    run: str
    setting: str
    value: Any
    baseline: tuple[Any, ...]  # the values of the baseline's source runs of that kind, each once

    def __str__(self) -> str:
        return f"{self.setting} {_show(self.value)} (baseline: {', '.join(map(_show, self.baseline))})"


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list, tuple, type(None))) else str(value)


def settings_mismatches(sources: Sequence[Mapping[str, Any]], runs: Mapping[str, Mapping[str, Any]]
                        ) -> list[SettingMismatch]:
    """Each :data:`GATED_SETTINGS` entry in which a run's ``args`` (``runs``: name -> args) differ from the
    ``args`` of all the baseline's ``sources`` of the same kind: sampled runs (temperature > 0) are compared with
    its sampled runs, greedy ones with its greedy runs (the two kinds may differ in prompts and concurrency). A
    run of a kind the baseline lacks has nothing to be compared with, and a setting a run or every source does not
    record (an older manifest) is not compared."""
    out = []
    for run, args in runs.items():
        kind = [s.get("args", {}) for s in sources if _sampled(s.get("args", {})) == _sampled(args)]
        for name in GATED_SETTINGS:
            value = _setting(args, name)
            have = _once([v for a in kind if (v := _setting(a, name)) is not _MISSING])
            if value is not _MISSING and have and value not in have:
                out.append(SettingMismatch(run, name, value, tuple(have)))
    return out


def _setting(args: Mapping[str, Any], name: str) -> Any:
    return args.get(name, _UNRECORDED.get(name, _MISSING))


def _sampled(args: Mapping[str, Any]) -> bool:
    return (args.get("temperature") or 0) > 0


def _once(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:  # values may be dicts: no set
            out.append(v)
    return out


def run_settings(runs: Sequence[Path]) -> dict[str, dict]:
    """Each run folder's recorded ``args``, by folder name, for :func:`settings_mismatches`."""
    return {str(run): read_manifest(run).get("args", {}) for run in runs}


# ---- snapshots: what a baseline stores and a new run is reduced to ------------------------------------------
def snapshot(runs: list[Path]) -> dict:
    """The comparable content of one or more run folders, from recorded results only. Sampled runs of the same
    prompts (other seeds) are pooled: each prompt's counts are summed over the runs."""
    sampled: list[list[RequestRecord]] = []  # one list per sampled run
    greedy: list[RequestRecord] = []
    explained: set[tuple[str, str, str, int]] = set()  # greedy divergences judged floating-point by `run`
    errors: dict[str, list[int]] = {}  # drafter -> failed requests per run
    speedups: dict[str, list[float]] = {}
    gammas, seeds = set(), []
    for run in runs:
        manifest = read_manifest(run)
        gammas.add(manifest["args"]["block_size"])
        every = read_records(run)
        for name in dict.fromkeys(r.drafter for r in every):
            errors.setdefault(name, []).append(sum(not r.ok for r in every if r.drafter == name))
        recs = [r for r in every if r.ok]
        if manifest["args"]["temperature"] > 0:
            sampled.append(recs)
            seeds.append(manifest["args"].get("seed"))
        else:
            greedy.extend(recs)
            explained |= _explained_divergences(run)
        if manifest["args"]["temperature"] > 0 and (run / SUMMARY).is_file():
            for g in _summary_groups(run):
                if g["scope"] == "all" and g["drafter"] != "none":
                    speedups.setdefault(g["drafter"], []).extend(g["speedup_vs_none_repeats"])
    if len(gammas) != 1:
        raise GateError(f"runs mix block sizes {sorted(gammas)}; gate one block size at a time")
    gamma = gammas.pop()
    drafters = sorted({r.drafter for recs in sampled for r in recs} | {r.drafter for r in greedy})
    return {
        "gamma": gamma,
        "sampled_seeds": seeds,
        "has_greedy": bool(greedy),
        "drafters": {d: {**_drafter_snapshot(d, sampled, greedy, speedups.get(d, []), gamma, explained),
                         "errors_per_run": errors.get(d, [])} for d in drafters},
        "lossless": _lossless(runs),
    }


def _summary_groups(run: Path) -> list[dict]:
    """The ``groups`` of a run's summary.json (:func:`~dspark_bench.evaluation.metrics.summarize`)."""
    accepted = f"the {SUMMARY} that dspark-bench run writes: an object with a 'groups' list"
    groups = read_json(run / SUMMARY, accepted).get("groups")
    if not isinstance(groups, list):
        raise GateError(f"{run / SUMMARY}: no 'groups' list; expected {accepted}")
    return groups


def _drafter_snapshot(name, sampled, greedy, speedups, gamma, explained=frozenset()) -> dict:
    domains: dict[str, dict[str, list[int]]] = {}
    per_run: list[dict[str, list[int]]] = []  # each sampled run's own (committed, rounds) per prompt
    per_prompt: dict[str, list[list[int]]] = {}
    examined, accepted = np.zeros(gamma, int), np.zeros(gamma, int)
    for recs in sampled:  # one run after the other: a prompt's counts add up over the runs (seeds)
        this_run: dict[str, list[int]] = {}
        for r in (r for r in recs if r.drafter == name and r.repeat == 0):
            key, pc = f"{r.dataset}/{r.prompt_id}", count_rounds(r.rounds, gamma)
            pair = domains.setdefault(r.domain, {}).setdefault(key, [0, 0])
            committed = sum(x[3] for x in r.rounds)
            pair[0] += committed
            pair[1] += len(r.rounds)
            this_run[key] = [committed, len(r.rounds)]
            have = per_prompt.setdefault(key, [[0] * gamma, [0] * gamma])
            have[0] = [a + b for a, b in zip(have[0], pc.examined_at, strict=True)]
            have[1] = [a + b for a, b in zip(have[1], pc.accepted_at, strict=True)]
            examined += np.array(pc.examined_at)
            accepted += np.array(pc.accepted_at)
        if this_run:
            per_run.append(this_run)
    return {
        "domains": {d: domains[d] for d in sorted(domains)},
        "tau_per_run": per_run,
        "positions": {"examined": examined.tolist(), "accepted": accepted.tolist()},
        "position_prompts": per_prompt,
        "speedup_repeats": speedups,
        "greedy_equal": _greedy_equal(name, greedy, explained),
    }


def _greedy_equal(name: str, greedy: list[RequestRecord], explained=frozenset()) -> bool | None:
    """True iff every temperature-0 output of ``name`` equals ``none``'s on the same prompt, or differs where
    ``run``'s forensics judged the divergence floating-point (``explained``: (drafter, dataset, prompt, repeat));
    None if no data."""
    ref = {(r.dataset, r.prompt_id, r.repeat): r.output_ids for r in greedy if r.drafter == "none"}
    mine = [r for r in greedy if r.drafter == name and (r.dataset, r.prompt_id, r.repeat) in ref]
    if name == "none" or not mine:
        return None
    return all(ref[(r.dataset, r.prompt_id, r.repeat)] == r.output_ids
               or (name, r.dataset, r.prompt_id, r.repeat) in explained for r in mine)


def _explained_divergences(run: Path) -> set[tuple[str, str, str, int]]:
    """The greedy divergences from ``none`` that ``run`` judged floating-point (its summary's
    ``greedy_equality``, :func:`dspark_bench.studies.diverge.greedy_equality`): a near-tie of the argmax flipped by
    rounding, not a bug. A run without that judgement explains none."""
    if not (run / SUMMARY).is_file():
        return set()
    report = read_json(run / SUMMARY, f"the {SUMMARY} that dspark-bench run writes").get("greedy_equality") or {}
    return {(name, f["dataset"], f["prompt_id"], f["repeat"]) for name, g in report.items()
            for f in g.get("divergences", []) if f.get("verdict") == "floating-point"}


def _lossless(runs: list[Path]) -> list[dict]:
    rows = []
    for run in runs:
        path = run / LOSSLESS_FILE
        if path.is_file():
            rows.extend(read_json(path, f"the {LOSSLESS_FILE} the lossless battery writes").get("rows", []))
    return rows


# ---- checks ---------------------------------------------------------------------------------------------------
def _tau(pairs: np.ndarray) -> float:  # pairs: [n, 2] (committed, rounds)
    return float(pairs[:, 0].sum() / max(pairs[:, 1].sum(), 1))


def tau_check(scope: str, base: dict[str, list[int]], new: dict[str, list[int]], tol: Tolerances,
              checks: int = 1, base_runs: Sequence[dict[str, list[int]]] = ()) -> Check:
    """tau ratio with an interval over prompts, paired where the runs share their prompts: its variance from the
    baseline's seeds (``base_runs``: each run's per-prompt counts) where it pools two or more that cover the
    compared prompts (:func:`seed_interval`), else a jackknife over the prompts (:func:`ratio_interval`)."""
    if not new:
        return Check("tau", scope, _tau(np.array(list(base.values()), float)), None, "", "fail")
    if min(len(base), len(new)) < tol.min_prompts:
        return Check("tau", scope, _tau(np.array(list(base.values()), float)),
                     _tau(np.array(list(new.values()), float)), "",
                     f"n/a: {min(len(base), len(new))} prompts < {tol.min_prompts} (see the pooled row)")
    tail = tol.family_alpha / (2 * checks)  # Bonferroni over the run's tau checks
    seeds = seed_interval(base_runs, base, new, tail)
    ratio, lo, hi = seeds if seeds else ratio_interval(base, new, tail)
    how = f", variance from {len(base_runs)} seeds" if seeds else ", jackknife"
    fail = ratio < 1 - tol.tau and hi < 1
    return Check("tau", scope, _tau(np.array(list(base.values()), float)), _tau(np.array(list(new.values()), float)),
                 f"ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}]{how}", "fail" if fail else "pass")


def _shared(base: dict, new: dict) -> list[str] | None:
    """The prompts both runs hold, sorted, when they are at least 80% of either run's (then pair them, so each
    prompt's difficulty cancels); else None (compare the runs unpaired)."""
    common = sorted(set(base) & set(new))
    return common if len(common) >= 0.8 * max(len(base), len(new)) else None


def _log_interval(ratio: float, var: float, df: float, tail: float) -> tuple[float, float, float]:
    """``ratio`` and its interval ratio x exp(+-t_df(1 - tail) sqrt(var)) (``var``: the variance of its log)."""
    from scipy import stats

    half = float(stats.t.ppf(1 - tail, df)) * math.sqrt(var)
    return float(ratio), float(ratio * math.exp(-half)), float(ratio * math.exp(half))


def seed_interval(base_runs: Sequence[dict[str, list[int]]], base: dict[str, list[int]],
                  new: dict[str, list[int]], tail: float) -> tuple[float, float, float] | None:
    """tau_new / tau_base and its interval (``tail`` in each tail), the variance measured across the baseline's
    K seeds, or None where that is not possible (fewer than 2 seeds, or the runs share under 80% of their
    prompts, or a seed lacks one of the shared prompts).

    Paired over the shared prompts, a prompt's difficulty cancels and what is left is each run's sampling noise
    around it: one seed's log tau over these prompts has, by the delta method, the variance
    v1 = sum_i var_s(c_si / C1 - r_si / R1) (c, r: a prompt's committed tokens and rounds in seed s; C1, R1: one
    seed's totals), estimated from the K seeds with n (K - 1) degrees of freedom. The new run is one more seed
    and the baseline their mean: Var(log ratio) = v1 (1 + 1 / K), and the interval uses a t quantile.

    Why not the jackknife alone: with 10 prompts its variance has 9 degrees of freedom, and an estimate that
    happens to be small makes a chance dip look resolved. Measured on 11 fresh seeds (baselines/smollm2-gate/
    power.md), 165 per-domain ratios of unchanged drafters: 5.5% of the jackknife's t statistics fell below the
    t distribution's 2.5% point; with the seeds' variance, 3.6% fell below the normal's 2.3%."""
    keys = _shared(base, new)
    if len(base_runs) < 2 or keys is None:
        return None
    if any(k not in run for run in base_runs for k in keys):
        return None
    k_seeds = len(base_runs)
    x = np.array([[run[k] for k in keys] for run in base_runs], float)  # [K, n, 2]
    c1, r1 = x[:, :, 0].sum() / k_seeds, x[:, :, 1].sum() / k_seeds
    n = np.array([new[k] for k in keys], float)
    if not c1 or not r1 or not n[:, 1].sum():
        return None
    ratio = float((n[:, 0].sum() / n[:, 1].sum()) / (x[:, :, 0].sum() / x[:, :, 1].sum()))
    if not ratio > 0:  # nothing committed in the new run: a drop needing no interval
        return ratio, 0.0, 0.0
    lin = x[:, :, 0] / c1 - x[:, :, 1] / r1  # [K, n]
    var = float(lin.var(axis=0, ddof=1).sum()) * (1 + 1 / k_seeds)
    return _log_interval(ratio, var, len(keys) * (k_seeds - 1), tail)


def ratio_interval(base: dict[str, Sequence[float]], new: dict[str, Sequence[float]],
                   tail: float) -> tuple[float, float, float]:
    """The ratio (sum num_new / sum den_new) / (sum num_base / sum den_base) of per-prompt (numerator,
    denominator) counts, and its two-sided interval with ``tail`` in each tail: a jackknife over prompts on the
    log scale with a t quantile. Paired (one prompt left out of both runs at a time) when the runs share at least
    80% of their prompts, so each prompt's difficulty cancels; else each run's log rate gets its own jackknife
    variance and the degrees of freedom are Welch-Satterthwaite's. Prompts with a zero denominator in both runs
    carry no information and are dropped.

    Why not a percentile bootstrap (this gate's first rule): with 10-20 prompts its extreme quantiles are too
    narrow. Simulated with 10 heterogeneous prompts and the gate's Bonferroni tail of 0.125%, the bootstrap's
    upper bound fell below a true ratio of 1 in 1.1% of unchanged reruns (9 times the nominal rate), the
    jackknife t bound in 0.1%; measured, unchanged drafters failed 3 of 11 fresh seeds on per-domain tau (10
    prompts each) under the bootstrap rule (baselines/smollm2-gate/power.md)."""
    def prep(d: dict[str, Sequence[float]], keys: list[str]) -> np.ndarray:
        return np.array([d[k] for k in keys], float).reshape(len(keys), 2)

    common = _shared(base, new)
    paired = common is not None
    if paired:
        b, n = prep(base, common), prep(new, common)
        keep = (b[:, 1] > 0) | (n[:, 1] > 0)
        b, n = b[keep], n[keep]
    else:
        b, n = prep(base, sorted(base)), prep(new, sorted(new))
        b, n = b[b[:, 1] > 0], n[n[:, 1] > 0]
    if not len(b) or not len(n) or not b[:, 0].sum() or not n[:, 1].sum():
        return math.nan, math.nan, math.nan
    ratio = (n[:, 0].sum() / n[:, 1].sum()) / (b[:, 0].sum() / b[:, 1].sum())
    if not ratio > 0:  # nothing accepted in the new run: no log scale, and no interval needed to call it a drop
        return float(ratio), 0.0, 0.0

    def loo_log(x: np.ndarray) -> np.ndarray:  # log rate with each row left out in turn
        num, den = x[:, 0].sum() - x[:, 0], x[:, 1].sum() - x[:, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(num / den)

    def jack_var(values: np.ndarray) -> float:
        m = len(values)
        values = values[np.isfinite(values)]
        return (m - 1) / m * float(((values - values.mean()) ** 2).sum()) if m > 1 and values.size else math.inf

    if paired:
        var, df = jack_var(loo_log(n) - loo_log(b)), len(b) - 1
    else:
        vb, vn = jack_var(loo_log(b)), jack_var(loo_log(n))
        var = vb + vn
        df = var**2 / (vb**2 / max(len(b) - 1, 1) + vn**2 / max(len(n) - 1, 1)) if var > 0 else 1
    if not math.isfinite(var) or df < 1:
        return float(ratio), 0.0, math.inf
    return _log_interval(ratio, var, df, tail)


def position_checks(name: str, base: dict, new: dict, tol: Tolerances,
                    checks: int = 1) -> list[Check]:  # base, new: drafter snapshots
    """Per-position conditional acceptance, rate ratio with a jackknife t interval over prompts (docstring)."""
    bp, nprompts = base.get("position_prompts"), new.get("position_prompts")
    if not bp or not nprompts:
        raise GateError(f"{name}: the baseline or the run lacks per-prompt position counts "
                        "(a baseline older than this rule): re-record it with 'dspark-bench baseline update'")
    eb, ab = (np.array([v[i] for v in bp.values()], float) for i in (0, 1))  # [P, G]
    en, an = (np.array([v[i] for v in nprompts.values()], float) for i in (0, 1))
    out = []
    for j in range(min(eb.shape[1], en.shape[1])):
        sb, sn = eb[:, j].sum(), en[:, j].sum()
        if not sb or not sn:
            continue
        rate_b, rate_n = ab[:, j].sum() / sb, an[:, j].sum() / sn
        reached = min(int((eb[:, j] > 0).sum()), int((en[:, j] > 0).sum()))
        if reached < tol.min_prompts or min(sb, sn) < tol.min_examined:  # too little data to judge (docstring)
            why = (f"reached in {reached} prompts < {tol.min_prompts}" if reached < tol.min_prompts
                   else f"{int(min(sb, sn))} rounds reached it < {tol.min_examined}")
            out.append(Check(f"accept@{j + 1}", name, float(rate_b), float(rate_n), f"n {int(sb)}/{int(sn)}",
                             f"n/a: {why}"))
            continue
        ratio, lo, hi = ratio_interval({k: (v[1][j], v[0][j]) for k, v in bp.items()},
                                       {k: (v[1][j], v[0][j]) for k, v in nprompts.items()},
                                       tol.family_alpha / (2 * checks))  # Bonferroni over the position checks
        fail = ratio < 1 - tol.position and hi < 1
        out.append(Check(f"accept@{j + 1}", name, float(rate_b), float(rate_n),
                         f"n {int(sb)}/{int(sn)}, ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}]", "fail" if fail else "pass"))
    return out


def speedup_check(name: str, base: list[float], new: list[float], tol: Tolerances, checks: int = 1) -> Check:
    """Speedup ratio new / base of the per-repeat speedups on the log scale, with a t interval (docstring)."""
    from scipy import stats

    base, new = [b for b in base if b and b > 0], [x for x in new if x and x > 0]
    if not base:
        return Check("speedup vs none", name, None, None, "", "n/a: baseline has no speedup")
    ref = statistics.median(base)
    if not new:
        return Check("speedup vs none", name, ref, None, "", "fail")
    lb, ln = np.log(base), np.log(new)
    dof = len(lb) + len(ln) - 2
    if dof < 1:  # no spread to estimate: the floor rule
        floor = ref * (1 - tol.speedup)
        fail = all(s < floor for s in new)
        return Check("speedup vs none", name, ref, statistics.median(new),
                     f"repeats {min(new):.2f}-{max(new):.2f}, floor {floor:.2f} (1 value each: no interval)",
                     "fail" if fail else "pass")
    spread = math.sqrt((((lb - lb.mean()) ** 2).sum() + ((ln - ln.mean()) ** 2).sum()) / dof)  # pooled sd
    diff = float(ln.mean() - lb.mean())
    half = float(stats.t.ppf(1 - tol.family_alpha / (2 * checks), dof)) * spread * math.sqrt(1 / len(lb) + 1 / len(ln))
    ratio, lo, hi = math.exp(diff), math.exp(diff - half), math.exp(diff + half)
    fail = ratio < 1 - tol.speedup and hi < 1
    return Check("speedup vs none", name, ref, statistics.median(new),
                 f"ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}] ({len(ln)} vs {len(lb)} repeats)", "fail" if fail else "pass")


def error_check(name: str, base: list[int] | None, new: list[int]) -> Check:
    """Failed requests per run may not rise above the baseline's most in any of its runs."""
    most = max(base) if base else 0
    note = "" if base is not None else "baseline recorded no error counts: taken as 0"
    worst = max(new) if new else 0
    return Check("errors", name, float(most), float(worst), note, "fail" if worst > most else "pass")


def greedy_check(name: str, base: bool | None, new: bool | None) -> Check | None:
    if base is None and new is None:
        return None
    if new is None:
        return Check("greedy == none", name, float(bool(base)), None, "", "n/a: run has no temperature-0 records")
    return Check("greedy == none", name, None if base is None else float(base), float(new), "",
                 "pass" if new else "fail")


def lossless_checks(base_rows: list[dict], new_rows: list[dict], sampled_only: bool = False) -> list[Check]:
    if not new_rows:
        if not base_rows:
            return []
        if sampled_only:
            return [Check("lossless", "battery", None, None, "", "n/a: sampled metrics only")]
        return [Check("lossless", "battery", None, None, f"no {LOSSLESS_FILE} in the runs; the baseline has "
                      f"{len(base_rows)} rows (run dspark-bench check-lossless --out RUN)", "fail")]
    out = []
    for row in new_rows:
        want = row.get("expected", "fail" if row.get("is_control") else "pass")
        scope = f"{row['test']} {row['configuration']}"
        out.append(Check("lossless", scope, None, row.get("p_value"), f"n={row.get('n')}",
                         "pass" if row["verdict"] == want else "fail"))
    return out


def compare(baseline: dict, new: dict, tol: Tolerances = Tolerances(), sampled_only: bool = False,
            drafters: Sequence[str] | None = None) -> list[Check]:
    """Every check of the module docstring, baseline vs a new snapshot. ``sampled_only``: judge the sampled
    metrics (tau, positions, speedup, errors) and skip greedy equality and the lossless battery. ``drafters``:
    judge only these baseline drafters' checks (with ``sampled_only``, for the power study's degraded reruns of
    one drafter); each check keeps the interval level of the whole gate (the Bonferroni split counts every
    baseline drafter), so the checks judged are exactly those the whole gate would make for these drafters."""
    if baseline["gamma"] != new["gamma"]:
        raise GateError(f"baseline block size {baseline['gamma']} != run block size {new['gamma']}")
    if drafters is not None:
        unknown = sorted(set(drafters) - set(baseline["drafters"]))
        if unknown or not drafters:
            raise GateError(f"cannot judge drafters {unknown or 'none given'}: the baseline has "
                            f"{', '.join(baseline['drafters'])}")
        if not sampled_only:
            raise GateError("judging only some drafters is for sampled reruns (--sampled-only): greedy equality "
                            "and the lossless battery are judged over the whole run")
    checks: list[Check] = []
    drafted = [d for name, d in baseline["drafters"].items() if name != "none"]
    n_tau = max(1, sum(1 + len(d["domains"]) for d in drafted))
    n_pos = max(1, sum(len(d["positions"]["examined"]) for d in drafted))
    n_speed = max(1, sum(bool(d["speedup_repeats"]) for d in drafted))
    judged = {name: b for name, b in baseline["drafters"].items() if drafters is None or name in drafters}
    for name, b in judged.items():
        n = new["drafters"].get(name)
        if n is None:
            checks.append(Check("present", name, None, None, "no record of this drafter in the runs", "fail"))
            continue
        checks.append(error_check(name, b.get("errors_per_run"), n.get("errors_per_run", [])))
        if b["domains"] and not n["domains"]:
            checks.append(Check("present", name, None, None, "no sampled (temperature > 0) ok record", "fail"))
            continue
        if name != "none":
            pooled_b = {k: v for pairs in b["domains"].values() for k, v in pairs.items()}
            pooled_n = {k: v for pairs in n["domains"].values() for k, v in pairs.items()}
            runs = b.get("tau_per_run", [])
            checks.append(tau_check(f"{name} / all", pooled_b, pooled_n, tol, n_tau, runs))
            for domain, pairs in b["domains"].items():
                checks.append(tau_check(f"{name} / {domain}", pairs, n["domains"].get(domain, {}), tol, n_tau,
                                        [{k: run[k] for k in pairs if k in run} for run in runs]))
        checks += position_checks(name, b, n, tol, n_pos)
        if name != "none":
            checks.append(speedup_check(name, b["speedup_repeats"], n["speedup_repeats"], tol, n_speed))
        if not sampled_only:
            checks += _greedy_checks(name, b, n, new)
    for name in sorted(set(new["drafters"]) - set(baseline["drafters"])):
        if drafters is None:
            checks.append(Check("present", name, None, None, "not in the baseline", "n/a: not judged"))
    return checks + lossless_checks(baseline["lossless"], new["lossless"], sampled_only)


def _greedy_checks(name: str, b: dict, n: dict, new: dict) -> list[Check]:
    if b["greedy_equal"] is not None and n["greedy_equal"] is None:
        why = ("the runs have no temperature-0 records (the baseline has)" if not new.get("has_greedy", True)
               else "no temperature-0 record of this drafter beside none's")
        return [Check("greedy == none", name, float(b["greedy_equal"]), None, why, "fail")]
    g = greedy_check(name, b["greedy_equal"], n["greedy_equal"])
    return [g] if g else []


def load_baseline(folder: Path) -> dict:
    path = Path(folder) / BASELINE_FILE
    if not path.is_file():
        raise GateError(f"{folder} is not a baseline: {BASELINE_FILE} missing (create one with "
                        "'dspark-bench baseline update RESULTS --name NAME')")
    return read_json(path, f"the {BASELINE_FILE} that 'dspark-bench baseline update' writes", GateError)


def write_baseline(runs: list[Path], folder: Path) -> Path:
    """Snapshot ``runs`` into ``folder``/baseline.json with the manifests of its source runs."""
    snap = snapshot(runs)
    snap["sources"] = [{"run": str(run), "args": read_manifest(run)["args"], "git": read_manifest(run).get("git"),
                        "versions": read_manifest(run).get("versions")} for run in runs]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BASELINE_FILE).write_text(json.dumps(snap, indent=1) + "\n")
    return folder / BASELINE_FILE


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def markdown(checks: list[Check]) -> str:
    lines = ["| metric | scope | baseline | new | interval | verdict |", "|---|---|---|---|---|---|"]
    for c in checks:
        verdict = "**FAIL**" if c.failed else c.verdict
        lines.append(f"| {c.metric} | {c.scope} | {_num(c.baseline)} | {_num(c.new)} | {c.interval} | {verdict} |")
    failed = sum(c.failed for c in checks)
    lines.append("")
    lines.append(f"**{failed} regression(s)**" if failed else "**no regression**")
    return "\n".join(lines) + "\n"

"""Relative gains with their 95% intervals, or withheld when too few prompts stand behind them.

A gain is shown with an interval or not at all (the value alone invites reading noise as an effect):

* **τ gain** of DSpark over a baseline = mean_d τ_DSpark(d) / mean_d τ_baseline(d) − 1 over the datasets d of a
  domain (or of all datasets: the macro average), τ(d) as summary.json records it (see :mod:`.tables`).
  Interval: paired percentile bootstrap over prompts, resampled within each dataset, one draw shared by both
  drafters where they decoded the same prompts; a resample's τ(d) = Σ committed / Σ rounds of the drawn
  prompts (``metrics.count_rounds``, first repeat, as τ itself).
* **speedup** over ``none`` = summary.json's ``speedup_vs_none``. Interval: paired percentile bootstrap over the
  group's prompts of the median over repeats of Σ decode tokens / Σ decode seconds of the drafter over the same
  for ``none`` (``metrics.tokens_per_s``).

A cell is withheld when the smallest dataset behind it (τ gains) or its group (speedups) has fewer than
:data:`MIN_PROMPTS` prompts: a percentile bootstrap over a handful of prompts is far too narrow, and over one
prompt it has no width at all. Values are summary.json's; the per-prompt numbers that the intervals resample are
read from the run's records (``records.jsonl`` or ``.gz``); a run without records has no interval, so its gains
are withheld too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dspark_bench.core.records import RequestRecord, ResultsError
from dspark_bench.evaluation.metrics import count_rounds, decode_tokens
from dspark_bench.evaluation.runs import read_records
from dspark_bench.report.load import Entry, RunData

MIN_PROMPTS = 10  # fewer prompts behind a gain: the gain is not shown
N_BOOT = 2000
LEVEL = 0.95
SEED = 0  # the resampling is part of the report: the same inputs give the same intervals

Method = tuple[str, str, str, int]  # run, drafter, scheduler, concurrency
Prompt = tuple[str, str]  # dataset, prompt id


@dataclass(frozen=True)
class PromptNumbers:
    """What one prompt contributes to τ and to tokens/s, per the definitions of :mod:`metrics`."""

    dataset: str
    domain: str
    committed: int  # over the rounds of the first repeat decoded without error
    rounds: int
    tokens: Mapping[int, int]  # repeat -> decode tokens
    seconds: Mapping[int, float]  # repeat -> decode seconds


@dataclass(frozen=True)
class Samples:
    """Per-prompt numbers of every method of every run (from its records), and why a run has none."""

    methods: Mapping[Method, Mapping[Prompt, PromptNumbers]]
    missing: Mapping[str, str]  # run name -> why its records could not be read

    def of(self, e: Entry, drafter: str | None = None) -> Mapping[Prompt, PromptNumbers] | None:
        """The prompts of ``e``'s group (its dataset, domain or all), for ``e``'s method or, with ``drafter``, that
        drafter at ``e``'s concurrency in ``e``'s run (any scheduler: ``none`` has no scheduler to speak of)."""
        if drafter is None:
            found = self.methods.get((e.run, e.drafter, e.scheduler, e.concurrency))
        else:
            found = next((v for (run, d, _, c), v in self.methods.items()
                          if (run, d, c) == (e.run, drafter, e.concurrency)), None)
        if found is None:
            return None
        field = {"dataset": "dataset", "domain": "domain"}.get(e.scope)
        return {k: p for k, p in found.items() if field is None or getattr(p, field) == e.name}


def _prompt_numbers(records: Sequence[RequestRecord], gamma: int) -> PromptNumbers:
    first = min(records, key=lambda r: r.repeat)
    counts = count_rounds(first.rounds, gamma)
    return PromptNumbers(first.dataset, first.domain, counts.committed, counts.rounds,
                         {r.repeat: decode_tokens(r) for r in records}, {r.repeat: r.decode_s for r in records})


def read_samples(runs: Sequence[RunData]) -> Samples:
    """Per-prompt numbers of the records of ``runs`` (records with an error are left out, as in the summary)."""
    methods: dict[Method, dict[Prompt, list[RequestRecord]]] = {}
    missing = {}
    for run in runs:
        try:
            records = read_records(run.path)
        except ResultsError as exc:
            missing[run.name] = str(exc)
            continue
        for r in records:
            if r.ok:
                key = (run.name, r.drafter, r.scheduler, r.concurrency)
                methods.setdefault(key, {}).setdefault((r.dataset, r.prompt_id), []).append(r)
    gamma = {run.name: run.block_size for run in runs}
    return Samples({m: {k: _prompt_numbers(v, gamma[m[0]]) for k, v in prompts.items()}
                    for m, prompts in methods.items()}, missing)


@dataclass(frozen=True)
class Gain:
    """A relative gain: the recorded value, its 95% interval, the prompts behind it, and why it is not shown."""

    value: float | None
    interval: tuple[float, float] | None
    n: int  # prompts behind the cell (the smallest dataset, for τ gains)
    withheld: str = ""  # why the value is not shown ("" when it is)

    @property
    def shown(self) -> bool:
        return self.value is not None and not self.withheld

    def text(self, ratio: bool = False) -> str:
        """'+5.6% [-1.2%, +12.0%]' (ratio: '1.16× [1.05, 1.27]'), the reason it is withheld, or '–'."""
        if self.value is None:
            return "–"
        if self.withheld:
            return self.withheld
        lo, hi = self.interval
        if ratio:
            return f"{self.value:.2f}× [{lo:.2f}, {hi:.2f}]"
        return f"{self.value:+.1%} [{lo:+.1%}, {hi:+.1%}]"


NO_RECORDS = "no per-prompt records: not shown"


def _judged(value: float | None, n: int, draw) -> Gain:
    """The gain, withheld below MIN_PROMPTS or without per-prompt numbers; ``draw()`` gives the bootstrap draws of
    it (None without the records to draw from)."""
    if value is None:
        return Gain(None, None, n)
    if n < MIN_PROMPTS:
        return Gain(value, None, n, f"n = {n} < {MIN_PROMPTS}: not shown")
    draws = draw()
    draws = None if draws is None else draws[np.isfinite(draws)]
    if draws is None or draws.size == 0:
        return Gain(value, None, n, NO_RECORDS)
    lo, hi = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Gain(value, (float(lo), float(hi)), n)


def _tau_draws(pairs: Sequence[tuple[Mapping[Prompt, PromptNumbers], Mapping[Prompt, PromptNumbers]]],
               rng: np.random.Generator) -> np.ndarray:
    """[N_BOOT] resampled mean_d τ_mine(d) / mean_d τ_base(d) − 1, resampling prompts within each dataset."""
    totals = np.zeros((2, N_BOOT))
    for mine, base in pairs:
        paired = mine.keys() == base.keys()
        idx = None
        for side, prompts in enumerate((mine, base)):
            per = np.array([[prompts[k].committed, prompts[k].rounds] for k in sorted(prompts)], float)  # [P, 2]
            if idx is None or not paired:
                idx = rng.integers(0, len(per), size=(N_BOOT, len(per)))
            sums = per[idx].sum(1)  # [N_BOOT, 2]
            totals[side] += sums[:, 0] / np.maximum(sums[:, 1], 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return totals[0] / totals[1] - 1


def tau_gain(value: float | None, mine: Sequence[Entry], base: Sequence[Entry], samples: Samples) -> Gain:
    """The τ gain ``value`` of the datasets ``mine`` over the same datasets ``base`` (per-dataset entries, in the
    same order), with its interval (module docstring)."""
    n = min((int(e.metrics.get("n_requests") or 0) for e in (*mine, *base)), default=0)

    def draw():
        pairs = [(samples.of(m), samples.of(b)) for m, b in zip(mine, base, strict=True)]
        if any(not m or not b for m, b in pairs):
            return None
        return _tau_draws(pairs, np.random.default_rng(SEED))

    return _judged(value, n, draw)


def _speedup_draws(mine: Mapping[Prompt, PromptNumbers], base: Mapping[Prompt, PromptNumbers],
                   rng: np.random.Generator) -> np.ndarray | None:
    """[N_BOOT] resampled speedups over the prompts (and repeats) both sides decoded."""
    keys = sorted(mine.keys() & base.keys())
    repeats = sorted(set.intersection(*({*mine[k].tokens} & {*base[k].tokens} for k in keys))) if keys else []
    if len(keys) < 2 or not repeats:
        return None
    arrays = [np.array([[getattr(side[k], f)[r] for r in repeats] for k in keys], float)  # [P, R]
              for side in (mine, base) for f in ("tokens", "seconds")]
    idx = rng.integers(0, len(keys), size=(N_BOOT, len(keys)))
    mt, ms, bt, bs = (a[idx].sum(1) for a in arrays)  # [N_BOOT, R]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.median((mt / ms) / (bt / bs), axis=1)


def speedup(e: Entry, samples: Samples) -> Gain:
    """``e``'s recorded speedup over ``none`` with its interval (module docstring)."""
    n = int(e.metrics.get("n_requests") or 0)

    def draw():
        mine, base = samples.of(e), samples.of(e, "none")
        return None if not mine or not base else _speedup_draws(mine, base, np.random.default_rng(SEED))

    return _judged(e.metrics.get("speedup_vs_none"), n, draw)


def caption(what: str, samples: Samples) -> str:
    """The sentences that say how the cells of ``what`` were bounded, when they are withheld, and which runs had no
    readable records to bound them with."""
    unread = "; ".join(f"{run}: {why}" for run, why in samples.missing.items())
    return (f"Brackets: 95% paired percentile bootstrap interval of {what} over prompts ({N_BOOT} resamples of "
            f"the prompts in records.jsonl, the same prompts for both sides). A value resting on fewer than "
            f"{MIN_PROMPTS} prompts is not shown ('n = 3 < {MIN_PROMPTS}'): so few prompts give no usable interval."
            + (f" No per-prompt records, so no intervals, for {unread}." if unread else ""))

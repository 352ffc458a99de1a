"""Tables of a report, as plain text cells, built from recorded numbers only.

The one derived quantity is the paper's presentation of Table 1: a **domain mean** is the unweighted mean of
a row's per-dataset τ over the datasets of that domain, and the **macro average** the mean over all datasets
(shown only when the row has every dataset, as in the paper); a **relative gain** is τ_DSpark / τ_baseline - 1
of those means, shown with its 95% interval or withheld (:mod:`.gains`). Per-dataset τ and its 95% interval are
read from ``summary.json``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.evaluation.metrics import MIN_ROUNDS, wilson
from dspark_bench.report import gains
from dspark_bench.report.gains import Samples, speedup, tau_gain
from dspark_bench.report.inputs import Calibration, CellRow, Lossless, Profile
from dspark_bench.report.load import Entry, Inputs, RunData
from dspark_bench.report.style import TAU_DEFINITION, domain_sort_key, fmt, fmt_ci

# A numeric cell ("5.68 [5.43, 5.93]", "+16.3% [+2.0%, +30.1%]", "1.02×", "1e-12", "–", "(0.25, n=4)", a gain withheld
# for want of prompts, "n = 3 < 10: not shown"): such columns are right-aligned.
_NUMERIC = re.compile(r"[-+−–]?[\d.,]*\d(e[-+]?\d+)?\s*[%×]?( \[[-+\d.,% ]+\])?|–|\(\d[\d.]*, n=\d+\)|"
                      r"n = \d+ < \d+: not shown|")


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    groups: tuple[tuple[str, int], ...] = ()  # optional header row spanning columns: (text, width)

    def text_columns(self) -> set[int]:
        """Columns holding text (left-aligned); the first column always does."""
        return {0} | {i for i in range(len(self.columns))
                      if not all(_NUMERIC.fullmatch(r[i]) for r in self.rows if i < len(r))}


def macro_mean(values: Sequence[float | None]) -> float | None:
    """Unweighted mean of per-dataset τ (the paper's domain means and macro average); None if any is missing."""
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def relative_gain(ours: float | None, base: float | None) -> float | None:
    """ours / base - 1 (the paper's 'DSpark vs X' percentages)."""
    return None if ours is None or not base else ours / base - 1


@dataclass(frozen=True)
class Grid:
    """Table 1 as numbers: per label, per dataset (τ, CI), plus domain means and the macro average."""

    labels: tuple[str, ...]
    datasets: tuple[str, ...]
    domains: Mapping[str, tuple[str, ...]]  # domain -> its datasets, in column order
    tau: Mapping[tuple[str, str], tuple[float | None, list | None]]  # (label, dataset) -> (tau, ci)

    def means(self, label: str) -> dict[str, float | None]:
        """Domain means and 'macro' for one row."""
        out = {d: macro_mean([self.value(label, n) for n in names]) for d, names in self.domains.items()}
        out["macro"] = macro_mean([self.value(label, n) for n in self.datasets])
        return out

    def value(self, label: str, dataset: str) -> float | None:
        return self.tau.get((label, dataset), (None, None))[0]


def grid(inputs: Inputs) -> Grid:
    entries = inputs.select("dataset")
    datasets = tuple(inputs.datasets())
    domains: dict[str, tuple[str, ...]] = {}
    for name in datasets:
        dom = inputs.domains.get(name, "custom")
        domains[dom] = (*domains.get(dom, ()), name)
    tau = {(inputs.label(e), e.name): (e.metrics.get("tau"), e.metrics.get("tau_ci95")) for e in entries}
    return Grid(tuple(inputs.labels(entries)), datasets, domains, tau)


def table1(inputs: Inputs) -> Table:
    """Rows drafters, columns datasets grouped by domain, each domain followed by its mean; macro last."""
    g = grid(inputs)
    columns, groups = ["drafter"], [("", 1)]
    for dom, names in g.domains.items():
        columns += [*names, f"{dom} mean"]
        groups.append((dom, len(names) + 1))
    columns.append("macro avg")
    groups.append(("all", 1))
    rows = []
    for label in g.labels:
        means = g.means(label)
        row = [label]
        for dom, names in g.domains.items():
            row += [fmt(g.value(label, n)) + fmt_ci(g.tau.get((label, n), (None, None))[1]) for n in names]
            row.append(fmt(means[dom]))
        rows.append((*row, fmt(means["macro"], ".3f")))
    caption = (f"{TAU_DEFINITION} Brackets: 95% bootstrap interval over prompts (from summary.json). Domain "
               "means and the macro average are unweighted means of the per-dataset τ, as in the paper's Table 1.")
    return Table("Accepted length τ per dataset", tuple(columns), tuple(rows), caption, tuple(groups))


def _suffix(label: str, drafter: str) -> str:
    """The label's variant part (everything after the drafter name)."""
    return label.removeprefix(drafter)


def gains_table(inputs: Inputs, samples: Samples) -> Table | None:
    """DSpark's relative gain over each baseline with the same variant suffix (domain means and macro), each with
    its 95% interval or withheld (:mod:`.gains`)."""
    g = grid(inputs)
    entries = {(inputs.label(e), e.name): e for e in inputs.select("dataset")}
    by_label = {label: e.drafter for (label, _), e in entries.items()}
    rows = []
    for mine in (lab for lab in g.labels if by_label[lab] == "dspark"):
        suffix = _suffix(mine, "dspark")
        for base in g.labels:
            if by_label[base] in ("dspark", "none") or _suffix(base, by_label[base]) != suffix:
                continue
            m, b = g.means(mine), g.means(base)
            cells = []
            for key, names in [*g.domains.items(), ("macro", g.datasets)]:
                value = relative_gain(m[key], b[key])
                pairs = [(entries[(mine, n)], entries[(base, n)]) for n in names if value is not None]
                cells.append(tau_gain(value, [p[0] for p in pairs], [p[1] for p in pairs], samples).text())
            rows.append((mine, base, *cells))
    if not rows:
        return None
    caption = ("τ_DSpark / τ_baseline − 1 of the domain means and macro average of the table above "
               "(none, vanilla decoding, has τ = 1 by definition and is left out). "
               + gains.caption("the gain", samples)
               + " Prompts are resampled within each dataset; n is the number of prompts in the cell's smallest "
               "dataset.")
    return Table("Relative gain of DSpark over each baseline", ("DSpark", "baseline", *g.domains, "macro"),
                 tuple(rows), caption)


@dataclass(frozen=True)
class PositionPoint:
    """Conditional acceptance at one draft position: the rate, its 95% Wilson interval and the rounds behind it
    (``examined``: rounds that tested this position; None where the summary does not record counts)."""

    rate: float | None
    interval: tuple[float, float] | None
    examined: int | None

    @property
    def enough(self) -> bool:
        return self.rate is not None and (self.examined is None or self.examined >= MIN_ROUNDS)


def position_points(positions: Mapping) -> list[PositionPoint]:
    """Per draft position k: accepted[k] / examined[k] with its Wilson interval (summary.json 'positions')."""
    cond = positions.get("conditional", [])
    accepted, examined = positions.get("accepted"), positions.get("examined")
    if accepted is None or examined is None:
        return [PositionPoint(c, None, None) for c in cond]
    return [PositionPoint(c, wilson(int(a), int(n)), int(n)) for c, a, n in zip(cond, accepted, examined, strict=True)]


def _position_cell(pt: PositionPoint) -> str:
    if pt.rate is None:
        return "–"
    if not pt.enough:
        return f"({fmt(pt.rate)}, n={pt.examined})"
    return fmt(pt.rate) + fmt_ci(pt.interval)


def positions_table(inputs: Inputs, entries: Sequence[Entry]) -> Table:
    """Conditional acceptance per draft position, one row per domain and series, with 95% Wilson intervals."""
    width = max((len(e.metrics.get("positions", {}).get("conditional", [])) for e in entries), default=0)
    rows = []
    for e in entries:
        points = position_points(e.metrics.get("positions", {}))
        rows.append((e.name, inputs.label(e), *(_position_cell(p) for p in points),
                     *("" for _ in range(width - len(points)))))
    caption = (f"Brackets: 95% Wilson interval over the rounds that tested the position. Rounds of one prompt are "
               f"correlated, so the intervals are narrower than a per-prompt interval would be. A position tested "
               f"in fewer than {MIN_ROUNDS} rounds is shown as (rate, n=rounds) and left out of the figure.")
    return Table("Conditional acceptance per draft position", ("domain", "drafter", *(f"k={j}" for j in range(1, width + 1))),
                 tuple(rows), caption)


def block_size_table(inputs: Inputs, entries: Sequence[Entry], omit: Sequence[str] = ("block_size", "run")) -> Table:
    """τ [95% CI] per series (labels without ``omit``) and domain (rows) and block size γ (columns)."""
    sizes = sorted({e.block_size for e in entries})
    cells = {(inputs.label(e, omit), e.name, e.block_size): e.metrics for e in entries}
    keys = dict.fromkeys((inputs.label(e, omit), e.name)
                         for e in sorted(entries, key=lambda e: (Inputs.order(e)[:-2], domain_sort_key(e.name))))
    rows = tuple((label, dom, *(fmt((cells.get((label, dom, g)) or {}).get("tau"))
                                + fmt_ci((cells.get((label, dom, g)) or {}).get("tau_ci95")) for g in sizes))
                 for label, dom in keys)
    return Table("τ by block size", ("drafter", "domain", *(f"γ={g}" for g in sizes)), rows, TAU_DEFINITION)


def _ms(p: Mapping[str, float] | None, key: str) -> str:
    value = (p or {}).get(key)
    return fmt(None if value is None else value * 1000, ".1f")


def processes(run: RunData) -> int:
    """How many processes timed a run's requests: one, or one per part of a merged run, plus one per resume."""
    return max(len(run.manifest.get("parts") or ()), 1) + len(run.manifest.get("resumed") or ())


def timing_note(runs: Sequence[RunData]) -> str:
    """A note naming the runs whose timings come from several processes (resumed or merged runs), or ''."""
    several = [r for r in runs if processes(r) > 1]
    if not several:
        return ""

    def why(r: RunData) -> str:
        parts, resumed = len(r.manifest.get("parts") or ()), r.manifest.get("resumed") or ()
        said = [f"merged from {parts} run folders"] if parts else []
        said += [f"resumed {len(resumed)}× (" + ", ".join(str(e.get("started", "?")) for e in resumed) + ")"] \
            if resumed else []
        return f"{r.name}: timings from {processes(r)} processes ({'; '.join(said)})"

    resumed = any(r.manifest.get("resumed") for r in several)
    return ("Note: " + "; ".join(why(r) for r in several) + ". Tokens/s pool requests timed by different "
            "processes (perhaps on other machines, under other loads)"
            + ("; in a resumed run a speedup may compare requests that were not timed side by side." if resumed
               else "."))


def speed_table(inputs: Inputs, samples: Samples) -> Table:
    """Wall-clock numbers over all prompts, as recorded in summary.json; speedups with their intervals."""
    rows = []
    for e in sorted(inputs.select("all"), key=Inputs.order):
        m = e.metrics
        gain = fmt(m.get("speedup_vs_none"), ".2f") + "×" if e.drafter == "none" else speedup(e, samples).text(True)
        rows.append((inputs.label(e), str(m.get("n_requests", "–")), str(m.get("n_errors", "–")), fmt(m.get("tau")),
                     fmt(m.get("tokens_per_s"), ".1f"), gain,
                     *(_ms(m.get("ttft_s"), q) for q in ("p50", "p90", "p99")),
                     *(_ms(m.get("tpot_s"), q) for q in ("p50", "p90", "p99"))))
    note = timing_note(inputs.runs)
    caption = ("tokens/s = decode tokens / decode seconds (the first token is timed in TTFT); speedup = tokens/s "
               "over `none` on the same prompts in the same run, median over repeats; TTFT and TPOT percentiles "
               "over requests, in milliseconds. Definitions: dspark_bench/evaluation/metrics.py. "
               + gains.caption("the speedup", samples) + (f" {note}" if note else ""))
    cols = ("drafter", "prompts", "errors", "τ", "tokens/s", "speedup vs none", "TTFT p50 (ms)", "TTFT p90 (ms)",
            "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p90 (ms)", "TPOT p99 (ms)")
    return Table("Wall-clock speed (all prompts)", cols, tuple(rows), caption)


def sweep_table(rows: Sequence[CellRow], caption: str) -> Table:
    out = tuple((r.drafter, r.domain or "all", str(r.concurrency), f"{r.theta:g}", fmt(r.numbers.get("accepted_per_step")),
                 fmt(r.numbers.get("rejected_per_step")), fmt(r.numbers.get("verified_acceptance_rate"), ".1%"),
                 fmt(r.numbers.get("tau"))) for r in sorted(rows, key=lambda r: (r.drafter, r.concurrency, r.theta)))
    return Table("Threshold sweep", ("drafter", "domain", "concurrency", "θ", "accepted/step", "rejected/step",
                                     "accepted/verified", "τ"), out, caption)


def load_table(rows: Sequence[CellRow], caption: str) -> Table:
    out = tuple((r.drafter, r.label, "simulated" if r.simulated else "measured", str(r.concurrency),
                 fmt(r.numbers.get("aggregate_tokens_per_s"), ".1f"), fmt(r.numbers.get("per_request_tps"), ".1f"),
                 fmt(r.numbers.get("mean_verify_budget")), fmt(r.numbers.get("tau")), fmt(r.numbers.get("waste"), ".1%"))
                for r in sorted(rows, key=lambda r: (r.simulated, r.drafter, r.label, r.concurrency)))
    return Table("Cells under load", ("drafter", "scheduler", "source", "concurrency", "throughput (tok/s)",
                                      "per-request tok/s", "verify budget", "τ", "waste"), out, caption)


def calibration_table(cal: Calibration) -> Table:
    rows = []
    for p in cal.positions:
        a = p.after
        rows.append((str(p.k), "–" if p.n is None else str(p.n), fmt(p.temperature),
                     fmt(p.before.ece, ".1%"), fmt(a and a.ece, ".1%"), fmt(p.before.auroc, ".3f"),
                     fmt(a and a.auroc, ".3f"), fmt(p.before.brier, ".3f"), fmt(a and a.brier, ".3f")))
    origin = ", ".join(f"{k}={v}" for k, v in cal.origin.items())
    return Table(f"Calibration of {cal.drafter} per position", ("k", "n", "T_k", "ECE before", "ECE after",
                 "AUROC before", "AUROC after", "Brier before", "Brier after"), tuple(rows),
                 f"Source: {cal.source}" + (f" (fitted on {origin})" if origin else ""))


def profile_table(p: Profile) -> Table:
    rows = tuple((str(c), *(fmt(v, ".1f") for v in row)) for c, row in zip(p.context_lengths, p.steps_per_s, strict=True))
    return Table("SPS (target steps/s) by context length and batch tokens B", ("context \\ B", *map(str, p.batch_tokens)),
                 rows, f"Source: {p.source}" + (f" ({p.where})" if p.where else ""))


def lossless_table(docs: Sequence[Lossless]) -> Table:
    rows = []
    for doc in docs:
        for r in doc.rows:
            ok = "yes" if r.verdict == r.expected else "NO"
            rows.append((r.test, r.configuration, "control" if r.is_control else "method", str(r.n),
                         fmt(r.statistic, ".3g"), fmt(r.p_value, ".3g"), r.verdict, r.expected, ok, r.detail))
    alphas = sorted({d.alpha for d in docs if d.alpha is not None})
    caption = ("Controls are deliberately broken samplers: a sound battery must reject them (expected 'fail'). "
               + (f"α = {', '.join(f'{a:g}' for a in alphas)}. " if alphas else "")
               + "Source: " + ", ".join(str(d.source) for d in docs))
    return Table("Lossless battery", ("test", "configuration", "kind", "n", "statistic", "p-value", "verdict",
                                      "expected", "as expected", "detail"), tuple(rows), caption)


def _versions(v: Mapping[str, str | None]) -> str:
    return ", ".join(f"{k} {x}" for k, x in v.items() if x)


def manifest_table(run: RunData) -> Table:
    """What reproduces a run: target, drafters, arguments, versions, machine, seeds, git state."""
    m = run.manifest
    args, machine = m.get("args", {}), m.get("machine", {})
    target = m.get("target", {})
    drafters = m.get("drafters", {})
    rows = [
        ("run folder", str(run.path)),
        ("target", f"{run.target} ({target.get('dtype', args.get('dtype', '?'))}, {target.get('device', '?')})"),
        ("drafters", ", ".join(drafters) if drafters else ", ".join(args.get("drafters", []))),
        ("arguments", ", ".join(f"{k}={v}" for k, v in args.items() if k not in ("drafters", "drafter_options"))),
        ("seeds", ", ".join(f"{k}: {v}" for k, v in m.get("seeds", {}).items())),
        ("versions", _versions(m.get("versions", {}))),
        ("machine", ", ".join(f"{k}={v}" for k, v in machine.items() if v is not None)),
        ("git", _git_cell(run)),
        ("time", f"{m.get('started', '?')} → {m.get('finished', 'unfinished')}"),
        *((("resumed", _resumed_cell(m["resumed"])),) if m.get("resumed") else ()),
        ("numbers from", run.summary_source),
    ]
    for name, info in drafters.items():
        config = info.get("config") if isinstance(info, Mapping) else None
        if config:
            rows.append((f"drafter {name}", ", ".join(f"{k}={v}" for k, v in config.items())))
        arch = info.get("architecture") if isinstance(info, Mapping) else None
        if arch:
            rows.append((f"drafter {name} architecture (as loaded)", ", ".join(f"{k}={v}" for k, v in arch.items())))
    return Table(f"Run {run.name}", ("field", "value"), tuple(rows))


def _resumed_cell(resumed: Sequence[Mapping]) -> str:
    """Each resume of a run (its manifest's ``resumed``): when, records kept, requests decoded, where."""
    def one(e: Mapping) -> str:
        git = (e.get("git") or {}).get("sha")
        return (f"{e.get('started', '?')} → {e.get('finished', 'unfinished')}: kept {e.get('kept', '?')} records, "
                f"decoded {e.get('requests', '?')} requests" + (f", at {str(git)[:10]}" if git else ""))

    return "; ".join(one(e) for e in resumed)


def _git_cell(run: RunData) -> str:
    """The commit(s) that recorded the run, each marked when the working tree had uncommitted changes."""
    def one(sha: str, dirty: bool | None) -> str:
        return sha + (" (DIRTY: uncommitted changes)" if dirty else " (git state not recorded)" if dirty is None
                      else " (clean)")

    states = run.git_states()
    if not run.manifest.get("parts"):
        return one(*states[0][1:])
    return "merged from: " + "; ".join(f"{Path(src).name} {one(sha, dirty)}" for src, sha, dirty in states)

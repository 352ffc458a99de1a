"""The sections of a report, in order. Each builder returns a :class:`Section` when its data is present, or
the reason it is missing (a string), which the report lists so a reader knows what was not measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from dspark_bench.report import figures, paper, tables
from dspark_bench.report.load import Inputs
from dspark_bench.report.style import TAU_DEFINITION, fmt
from dspark_bench.report.tables import Table


@dataclass(frozen=True)
class Section:
    key: str  # anchor and PNG file stem
    title: str
    caption: str
    figures: tuple[go.Figure, ...] = ()
    tables: tuple[Table, ...] = ()


@dataclass(frozen=True)
class Missing:
    key: str
    title: str
    reason: str


def _table1(inp: Inputs) -> Section | str:
    if not inp.select("dataset"):
        return "no run with per-dataset results (summary.json groups with scope 'dataset')"
    gains = tables.gains_table(inp)
    return Section("table1", "Accepted length τ (Table 1)", "Rows: drafters; columns: datasets grouped by domain.",
                   tables=(tables.table1(inp), *([gains] if gains else [])))


def _paper(inp: Inputs) -> Section | str:
    if not inp.select("dataset"):
        return "no per-dataset results to compare"
    return paper.paper_section(inp)


def _with_positions(inp: Inputs, scope: str):
    return [e for e in inp.select(scope) if any(c is not None for c in e.metrics.get("positions", {})
                                                   .get("conditional", []))]


def _positions(inp: Inputs) -> Section | str:
    entries = _with_positions(inp, "domain")
    if not entries:
        return "no drafter with verified draft tokens (only `none`, or no domain groups in summary.json)"
    doms = sorted({e.name for e in entries})
    caption = ("P(x_k accepted | x_1..x_{k−1} accepted) = accepted[k] / examined[k], pooled over rounds "
               "(metrics.py 'conditional'). A flat curve means the drafter does not lose track along the block.")
    return Section("positions", "Position-wise conditional acceptance (Figure 2)", caption,
                   (figures.positions_figure(inp, entries),),
                   tuple(tables.positions_table(inp, d, [e for e in entries if e.name == d]) for d in doms))


def _histogram(inp: Inputs) -> Section | str:
    entries = [e for e in _with_positions(inp, "all") if e.metrics.get("histogram")]
    if not entries:
        return "no drafter with verified draft tokens"
    caption = "Share of rounds in which A draft tokens were accepted (summary.json 'histogram'), all prompts."
    return Section("histogram", "Accepted-length histogram", caption, (figures.histogram_figure(inp, entries),))


def _block_size(inp: Inputs) -> Section | str:
    sizes = sorted({r.block_size for r in inp.runs})
    if len(sizes) < 2:
        return f"needs runs with at least two block sizes (--block-size); found γ = {sizes or 'none'}"
    entries = [e for e in inp.select("domain") if e.drafter != "none"]
    rows = tuple((inp.label(e, ("block_size", "run")), e.name, str(e.block_size), fmt(e.metrics.get("tau")))
                 for e in sorted(entries, key=lambda e: (inp.label(e, ("block_size", "run")), e.name, e.block_size)))
    table = Table("τ by block size", ("drafter", "domain", "γ", "τ"), rows)
    return Section("block_size", "τ against block size (Figure 4)", TAU_DEFINITION,
                   (figures.block_size_figure(inp, entries),), (table,))


def _sweep(inp: Inputs) -> Section | str:
    sweeps = inp.artifacts.get("sweep", ())
    if not sweeps:
        return "no sweep.json among the inputs (static-threshold sweep)"
    rows = tuple((s.drafter, p.domain, f"{p.theta:g}", fmt(p.accepted_per_step), fmt(p.rejected_per_step),
                  fmt(p.acceptance_rate, ".1%")) for s in sweeps for p in s.points)
    table = Table("Threshold sweep", ("drafter", "domain", "θ", "accepted/step", "rejected/step", "acceptance"), rows,
                  "Source: " + ", ".join(str(s.source) for s in sweeps))
    caption = ("A draft prefix is verified up to the first position whose confidence c_k falls below θ; θ = 0 "
               "verifies the whole block. Acceptance rate = accepted / verified draft tokens.")
    return Section("sweep", "Threshold sweep (Figure 5)", caption, (figures.sweep_figure(sweeps),), (table,))


def _calibration(inp: Inputs) -> Section | str:
    cals = inp.artifacts.get("calibration", ())
    if not cals:
        return "no calibration.json among the inputs (confidence-head reliability data)"
    rows = []
    for c in cals:
        for p in c.positions:
            a = p.after
            rows.append((c.drafter, str(p.k), fmt(p.before.ece, ".1%"), fmt(a and a.ece, ".1%"),
                         fmt(p.before.auroc, ".3f"), fmt(a and a.auroc, ".3f"), fmt(p.before.brier, ".3f"),
                         fmt(a and a.brier, ".3f")))
    table = Table("Calibration per position", ("drafter", "k", "ECE before", "ECE after", "AUROC before",
                                               "AUROC after", "Brier before", "Brier after"), tuple(rows),
                  "Source: " + ", ".join(str(c.source) for c in cals))
    caption = ("Predicted P(A ≥ k) = product of the conditional confidences c_1..c_k, against the observed "
               "indicator 1[A ≥ k]. ECE: |mean prediction − observed share| weighted by bin mass.")
    return Section("calibration", "Calibration before and after (Figure 6)", caption,
                   tuple(figures.reliability_figure(c) for c in cals if c.reliability), (table,))


def _profile(inp: Inputs) -> Section | str:
    profs = inp.artifacts.get("profile", ())
    if not profs:
        return "no profile.json among the inputs (engine step-rate profile)"
    tabs = tuple(Table(f"SPS (steps/s): {p.source}", ("context \\ B", *map(str, p.batch_tokens)),
                       tuple((str(c), *(fmt(v, ".1f") for v in row))
                             for c, row in zip(p.context_lengths, p.steps_per_s, strict=True)), p.note or "")
                 for p in profs)
    caption = "Target forward steps per second at B batch tokens, profiled once; the scheduler's cost model reads it."
    return Section("profile", "Engine profile: SPS(B)", caption, tuple(figures.profile_figure(p) for p in profs), tabs)


def _load(inp: Inputs) -> Section | str:
    sweeps = inp.artifacts.get("concurrency", ()) + inp.artifacts.get("simulation", ())
    if not sweeps:
        return "no concurrency.json (measured) or simulation.json (simulated) among the inputs"
    rows = tuple((p.drafter, p.source, str(p.concurrency), fmt(p.throughput_tok_s, ".1f"), fmt(p.per_user_tps, ".1f"),
                  fmt(p.verify_budget)) for s in sweeps for p in s.points)
    table = Table("Load sweep", ("drafter", "source", "concurrency", f"throughput ({sweeps[0].throughput_unit})",
                                 "per-user tok/s", "verify budget"), rows,
                  "Source: " + ", ".join(str(s.source) for s in sweeps))
    caption = ("Solid lines, filled markers: measured. Dashed lines, open markers: simulated. Verify budget = "
               "tokens verified per request per step, including the current token (MTP-1 is flat at 2).")
    return Section("load", "Throughput and verify budget vs concurrency (Figures 7–8)", caption,
                   (figures.load_figure(sweeps),), (table,))


def _speed(inp: Inputs) -> Section | str:
    if not inp.select("all"):
        return "no run summary"
    entries = [e for e in inp.select("domain") if e.drafter != "none" and e.metrics.get("speedup_vs_none")]
    figs = (figures.speed_figure(inp, entries),) if entries else ()
    return Section("speed", "Wall-clock speed", "Measured on the machine in the run manifest; compare ratios, "
                   "not absolute times, across machines.", figs, (tables.speed_table(inp),))


def _lossless(inp: Inputs) -> Section | str:
    docs = inp.artifacts.get("lossless", ())
    if not docs:
        return "no lossless.json among the inputs (lossless test battery)"
    return Section("lossless", "Lossless battery", "Statistical tests that speculative sampling leaves the "
                   "target's output distribution unchanged.", tables=(tables.lossless_table(docs),))


def _manifest(inp: Inputs) -> Section | str:
    if not inp.runs:
        return "no run folders among the inputs"
    return Section("manifest", "Run manifests", "Everything needed to reproduce each figure's data.",
                   tables=tuple(tables.manifest_table(r) for r in inp.runs))


BUILDERS: tuple[tuple[str, str, Callable[[Inputs], Section | str]], ...] = (
    ("table1", "Accepted length τ (Table 1)", _table1),
    ("paper", "Comparison with the paper's Table 1", _paper),
    ("positions", "Position-wise conditional acceptance (Figure 2)", _positions),
    ("histogram", "Accepted-length histogram", _histogram),
    ("block_size", "τ against block size (Figure 4)", _block_size),
    ("sweep", "Threshold sweep (Figure 5)", _sweep),
    ("calibration", "Calibration before and after (Figure 6)", _calibration),
    ("profile", "Engine profile: SPS(B)", _profile),
    ("load", "Throughput and verify budget vs concurrency (Figures 7–8)", _load),
    ("speed", "Wall-clock speed", _speed),
    ("lossless", "Lossless battery", _lossless),
    ("manifest", "Run manifests", _manifest),
)


def build_sections(inp: Inputs) -> tuple[list[Section], list[Missing]]:
    present, missing = [], []
    for key, title, build in BUILDERS:
        out = build(inp)
        if isinstance(out, Section):
            present.append(out)
        else:
            missing.append(Missing(key, title, out))
    return present, missing

"""The sections of a report, in order. Each builder returns a :class:`Section` when its data is present, or
the reason it is missing (a string), which the report lists so a reader knows what was not measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from dspark_bench.report import figures, paper, serving, tables
from dspark_bench.report.gains import Samples, read_samples
from dspark_bench.report.load import Entry, Inputs
from dspark_bench.report.style import TAU_DEFINITION, domain_sort_key
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


def _table1(inp: Inputs, samples: Samples) -> Section | str:
    if not inp.select("dataset"):
        return "no run with per-dataset results (summary.json groups with scope 'dataset')"
    gains = tables.gains_table(inp, samples)
    notes = "".join(f" {name}: {note}." for name, note in paper.stand_in_notes(inp).items())
    return Section("table1", "Accepted length τ (Table 1)", "Rows: drafters; columns: datasets grouped by domain."
                   + notes, tables=(tables.table1(inp), *([gains] if gains else [])))


def _paper(inp: Inputs, samples: Samples) -> Section | str:
    if not inp.select("dataset"):
        return "no per-dataset results to compare"
    found = paper.comparison_tables(inp)
    if isinstance(found, str):
        return found
    caption = ("The paper's offline protocol: temperature 1.0, block size 7, no scheduler, 2048 new tokens. "
               "Small --limit or --max-new-tokens runs are smoke tests, not replications.")
    return Section("paper", "Comparison with the paper's Table 1", caption, tables=tuple(found))


def _with_positions(inp: Inputs, scope: str):
    return [e for e in inp.select(scope) if any(c is not None for c in e.metrics.get("positions", {})
                                                   .get("conditional", []))]


def _positions(inp: Inputs, samples: Samples) -> Section | str:
    entries = _with_positions(inp, "domain")
    if not entries:
        return "no drafter with verified draft tokens (only `none`, or no domain groups in summary.json)"
    ordered = sorted(entries, key=lambda e: (domain_sort_key(e.name), Inputs.order(e)))
    caption = ("P(x_k accepted | x_1..x_{k−1} accepted) = accepted[k] / examined[k], pooled over rounds "
               "(metrics.py 'conditional'). A flat curve means the drafter does not lose track along the block.")
    return Section("positions", "Position-wise conditional acceptance (Figure 2)", caption,
                   (figures.positions_figure(inp, entries),),
                   (tables.positions_table(inp, ordered),))


def _histogram(inp: Inputs, samples: Samples) -> Section | str:
    entries = [e for e in _with_positions(inp, "all") if e.metrics.get("histogram")]
    if not entries:
        return "no drafter with verified draft tokens"
    caption = "Share of rounds in which A draft tokens were accepted (summary.json 'histogram'), all prompts."
    return Section("histogram", "Accepted-length histogram", caption, (figures.histogram_figure(inp, entries),))


def _block_size(inp: Inputs, samples: Samples) -> Section | str:
    sizes = sorted({r.block_size for r in inp.runs})
    omit = ("block_size", "run")
    entries = [e for e in inp.select("domain") if e.drafter != "none"]
    swept = {lab for lab in inp.labels(entries, omit)
             if len({e.block_size for e in entries if inp.label(e, omit) == lab}) > 1}
    if not swept:
        return f"needs one drafter run with at least two block sizes (--block-size); found γ = {sizes or 'none'}"
    entries = [e for e in entries if inp.label(e, omit) in swept]
    omit = block_size_omit(inp, entries)
    return Section("block_size", "τ against block size (Figure 4)", TAU_DEFINITION,
                   (figures.block_size_figure(inp, entries, omit),), (tables.block_size_table(inp, entries, omit),))


def block_size_omit(inp: Inputs, entries: Sequence[Entry]) -> tuple[str, ...]:
    """Series of the block-size figure join runs at different γ, unless two runs of one series share a γ (say,
    two checkpoints whose manifests record no architecture to tell them apart): then each run is its own series."""
    keys = [(inp.label(e, ("block_size", "run")), e.name, e.block_size) for e in entries]
    return ("block_size", "run") if len(keys) == len(set(keys)) else ("block_size",)


def _cells(inp: Inputs, kinds: tuple[str, ...]) -> list:
    return [row for kind in kinds for doc in inp.artifacts.get(kind, ()) for row in doc.rows]


def _sources(docs) -> str:
    return "Source: " + ", ".join(str(d.source) for d in docs)


def _sweep(inp: Inputs, samples: Samples) -> Section | str:
    rows = [r for r in _cells(inp, ("sweep",)) if r.scheduler == "threshold" and r.theta is not None
            and r.request_rate is None]
    if not rows:
        return "no threshold-sweep cells (sweep.json rows of scheduler 'threshold' with options.theta)"
    caption = ("A draft prefix is verified up to the first position whose confidence c_k falls below θ; θ = 0 "
               "verifies the whole block. Per step = per verification round; acceptance = accepted / verified.")
    return Section("sweep", "Threshold sweep (Figure 5)", caption, (figures.sweep_figure(rows),),
                   (tables.sweep_table(rows, _sources(inp.artifacts["sweep"])),))


def _calibration(inp: Inputs, samples: Samples) -> Section | str:
    cals = inp.artifacts.get("calibration", ())
    if not cals:
        return "no calibration.json among the inputs (confidence-head reliability data)"
    caption = ("Predicted P(A ≥ k) = product of the conditional confidences c_1..c_k, against the observed "
               "indicator 1[A ≥ k]. ECE: |mean prediction − observed share| per bin, weighted by bin mass.")
    return Section("calibration", "Calibration before and after (Figure 6)", caption,
                   tuple(figures.reliability_figure(c) for c in cals), tuple(tables.calibration_table(c) for c in cals))


def _profile(inp: Inputs, samples: Samples) -> Section | str:
    profs = inp.artifacts.get("profile", ())
    if not profs:
        return "no profile.json among the inputs (engine step-rate profile)"
    caption = "Target forward steps per second at B batch tokens, profiled once; the scheduler's cost model reads it."
    return Section("profile", "Engine profile: SPS(B)", caption, tuple(figures.profile_figure(p) for p in profs),
                   tuple(tables.profile_table(p) for p in profs))


def _load(inp: Inputs, samples: Samples) -> Section | str:
    rows = [r for r in _cells(inp, ("sweep", "simulate")) if r.request_rate is None]
    if not rows:
        return "no sweep.json (measured) or simulate.json (simulated) with concurrency cells among the inputs"
    docs = inp.artifacts.get("sweep", ()) + inp.artifacts.get("simulate", ())
    notes = " ".join(d.note for d in docs if d.note)
    caption = ("Filled circles: MEASURED through the engine (sweep.json). Open diamonds: SIMULATED by replaying "
               "recorded rounds against the SPS profile (simulate.json). Verify budget = tokens verified per "
               "request per step, including the current token (MTP-1 is flat at 2). " + notes)
    series = [r for r in rows if sum((x.drafter, x.label, x.simulated) == (r.drafter, r.label, r.simulated)
                                     for x in rows) > 1]  # the figure shows curves; single cells stay in the table
    return Section("load", "Throughput and verify budget vs concurrency (Figures 7–8)", caption,
                   (figures.load_figure(series or rows),), (tables.load_table(rows, _sources(docs)),))


def _serving_runs(inp: Inputs, samples: Samples) -> Section | str:
    runs = [r for r in inp.runs if serving.run_blocks(r)]
    if not runs:
        return "no run under open-loop load (a summary.json with a 'serving' block: run --request-rate)"
    return Section("serving", "Serving metrics", "Open-loop runs: requests arrive on a seeded schedule "
                   "(manifest engine.arrivals) whatever the engine is doing; each drafter on its own clock.",
                   tables=(serving.runs_table(runs),))


def _serving_sweep(inp: Inputs, samples: Samples) -> Section | str:
    docs = [d for d in inp.artifacts.get("sweep", ()) if any(r.request_rate is not None for r in d.rows)]
    if not docs:
        return "no request-rate sweep (sweep.json rows with request_rate: sweep --request-rate)"
    rows = [r for d in docs for r in d.rows if r.request_rate is not None]
    compared = [d.serving for d in docs if d.serving is not None]
    slo = next((c.tpot_slo_ms for c in compared if c.tpot_slo_ms), None)
    caption = ("Every method of a rate decodes the same prompts on the same seeded arrival schedule. System tok/s = "
               "output tokens / the run's span; per-user tok/s = 1000 / mean TPOT; goodput = requests/s within the "
               "SLO. " + _sources(docs))
    return Section("serving_sweep", "Serving under increasing load (request-rate sweep)", caption,
                   serving.sweep_figures(rows, slo),
                   (*(serving.comparison_table(c) for c in compared), serving.sweep_cells_table(rows, _sources(docs))))


def _speed(inp: Inputs, samples: Samples) -> Section | str:
    if not inp.select("all"):
        return "no run summary"
    entries = [e for e in inp.select("domain") if e.drafter != "none" and e.metrics.get("speedup_vs_none")]
    several = [f"{r.name} ({tables.processes(r)})" for r in inp.runs if tables.processes(r) > 1]
    short = f"Timings from several processes: {', '.join(several)}; see the note below the table" if several else ""
    figs = (figures.speed_figure(inp, entries, samples, short),) if entries else ()
    note = tables.timing_note(inp.runs)
    return Section("speed", "Wall-clock speed", "Measured on the machine in the run manifest; compare ratios, "
                   "not absolute times, across machines." + (f" {note}" if note else ""), figs,
                   (tables.speed_table(inp, samples),))


def _lossless(inp: Inputs, samples: Samples) -> Section | str:
    docs = inp.artifacts.get("lossless", ())
    if not docs:
        return "no lossless.json among the inputs (lossless test battery)"
    return Section("lossless", "Lossless battery", "Statistical tests that speculative sampling leaves the "
                   "target's output distribution unchanged.", tables=(tables.lossless_table(docs),))


def _manifest(inp: Inputs, samples: Samples) -> Section | str:
    if not inp.runs:
        return "no run folders among the inputs"
    return Section("manifest", "Run manifests", "Everything needed to reproduce each figure's data.",
                   tables=tuple(tables.manifest_table(r) for r in inp.runs))


BUILDERS: tuple[tuple[str, str, Callable[[Inputs, Samples], Section | str]], ...] = (
    ("table1", "Accepted length τ (Table 1)", _table1),
    ("paper", "Comparison with the paper's Table 1", _paper),
    ("positions", "Position-wise conditional acceptance (Figure 2)", _positions),
    ("histogram", "Accepted-length histogram", _histogram),
    ("block_size", "τ against block size (Figure 4)", _block_size),
    ("sweep", "Threshold sweep (Figure 5)", _sweep),
    ("calibration", "Calibration before and after (Figure 6)", _calibration),
    ("profile", "Engine profile: SPS(B)", _profile),
    ("load", "Throughput and verify budget vs concurrency (Figures 7–8)", _load),
    ("serving_sweep", "Serving under increasing load (request-rate sweep)", _serving_sweep),
    ("serving", "Serving metrics", _serving_runs),
    ("speed", "Wall-clock speed", _speed),
    ("lossless", "Lossless battery", _lossless),
    ("manifest", "Run manifests", _manifest),
)


def build_sections(inp: Inputs) -> tuple[list[Section], list[Missing]]:
    """The sections with data, and the reasons of those without. Per-prompt numbers (for the intervals of gains)
    are read from the runs' records once, here."""
    present, missing = [], []
    samples = read_samples(inp.runs)
    for key, title, build in BUILDERS:
        out = build(inp, samples)
        if isinstance(out, Section):
            present.append(out)
        else:
            missing.append(Missing(key, title, out))
    return present, missing

"""Serving in a report: the ``serving`` block of run summaries as a table, and a request-rate sweep
(``sweep --request-rate``) as the paper's serving views. Numbers as recorded (metrics:
:mod:`dspark_bench.evaluation.serving`; comparisons: :mod:`dspark_bench.studies.serving_sweep`), never re-derived.

A sweep's *method* is a drafter under a scheduler (``dspark · hardware-aware``); each is one line across the
offered request rates, in its drafter's colour, its schedulers told apart by dash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from dspark_bench.report.inputs import CellRow, ServingComparison
from dspark_bench.report.load import RunData
from dspark_bench.report.style import DASHES, drafter_colour, fmt, style_figure
from dspark_bench.report.tables import Table


# ---- runs ------------------------------------------------------------------------------------------------------
def run_blocks(run: RunData) -> dict[str, Mapping]:
    """{drafter: serving metrics} of a run's summary; a summary written before the block was kept per drafter holds
    one flat block (the server engine's one configuration), named by its only drafter."""
    block = run.summary.get("serving")
    if not isinstance(block, Mapping) or not block:
        return {}
    if "completed" in block:
        names = list(dict.fromkeys(g["drafter"] for g in run.summary.get("groups", [])))
        return {names[0] if len(names) == 1 else "server": block}
    return {name: b for name, b in block.items() if isinstance(b, Mapping)}


def _rate(run: RunData) -> str:
    rate = run.manifest.get("args", {}).get("request_rate")
    return "closed loop" if rate is None else f"{rate:g}" if isinstance(rate, int | float) else str(rate)


RUN_COLUMNS = (("completed", "completed", "d"), ("failed", "failed", "d"),
               ("requests/s", "request_throughput", ".3g"), ("output tok/s", "output_throughput", ".1f"),
               ("per-user tok/s", "per_user_tokens_per_s", ".1f"), ("TTFT p50 ms", "median_ttft_ms", ".0f"),
               ("TTFT p90 ms", "p90_ttft_ms", ".0f"), ("TPOT p50 ms", "median_tpot_ms", ".0f"),
               ("TPOT p90 ms", "p90_tpot_ms", ".0f"), ("ITL p90 ms", "p90_itl_ms", ".0f"),
               ("E2EL p90 ms", "p90_e2el_ms", ".0f"), ("queue mean ms", "mean_queue_ms", ".0f"),
               ("goodput req/s", "request_goodput", ".3g"))


def runs_table(runs: Sequence[RunData]) -> Table:
    """One row per run and drafter with a serving block."""
    rows = []
    for run in runs:
        for drafter, b in run_blocks(run).items():
            rows.append((run.name, drafter, _rate(run),
                         *(fmt(b.get(key), spec) for _, key, spec in RUN_COLUMNS)))
    slos = sorted({", ".join(f"{k} {v:g} ms" for k, v in b["slo_ms"].items())
                   for run in runs for b in run_blocks(run).values() if b.get("slo_ms")})
    caption = ("Latencies from each request's arrival on the seeded schedule; TPOT = (E2EL − TTFT) / (tokens − 1), "
               "per-user tok/s = 1000 / mean TPOT; ITL = gaps between deliveries (a round's or a chunk's tokens "
               "together). Goodput: requests/s within " + ("; ".join(slos) if slos else "no SLO given") + ".")
    return Table("Serving metrics", ("run", "drafter", "offered req/s", *(c for c, _, _ in RUN_COLUMNS)),
                 tuple(rows), caption)


# ---- request-rate sweeps ----------------------------------------------------------------------------------------
def _methods(rows: Sequence[CellRow]) -> dict[tuple[str, str], dict]:
    """(drafter, label) -> its line style, in first-seen order."""
    out, seen = {}, {}
    for drafter, label in dict.fromkeys((r.drafter, r.label) for r in rows):
        n = seen[drafter] = seen.get(drafter, -1) + 1
        out[(drafter, label)] = {"line": {"color": drafter_colour(drafter), "dash": DASHES[n % len(DASHES)]},
                                 "marker": {"size": 8}}
    return out


def _value(row: CellRow, key: str) -> float | None:
    return row.request_rate if key == "request_rate" else row.numbers.get(key)


def _figure(rows: Sequence[CellRow], x: str, y: str, title: str, x_title: str, y_title: str) -> go.Figure:
    """One line per method through its cells (by rate), ``x`` and ``y`` numbers of the rows."""
    fig = go.Figure()
    for (drafter, label), style in _methods(rows).items():
        pts = sorted((r for r in rows if (r.drafter, r.label) == (drafter, label)), key=lambda r: r.request_rate)
        fig.add_trace(go.Scatter(x=[_value(r, x) for r in pts], y=[_value(r, y) for r in pts],
                                 name=f"{drafter} · {label}", mode="lines+markers", **style,
                                 customdata=[r.request_rate for r in pts],
                                 hovertemplate="%{customdata:g} req/s<extra></extra>"))
    fig.update_xaxes(title_text=x_title, rangemode="tozero")
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return style_figure(fig, title)


def sweep_figures(rows: Sequence[CellRow], tpot_slo_ms: float | None) -> tuple[go.Figure, ...]:
    """Per-user against system tokens/s (the Pareto view), p90 TPOT against system tokens/s (with the SLO), and
    goodput against the offered rate."""
    pareto = _figure(rows, "output_throughput", "per_user_tokens_per_s", "Per-user vs system tokens/s",
                     "system throughput (output tok/s)", "per-user tokens/s (1000 / mean TPOT)")
    latency = _figure(rows, "output_throughput", "p90_tpot_ms", "p90 TPOT vs system throughput",
                      "system throughput (output tok/s)", "p90 TPOT (ms)")
    if tpot_slo_ms:
        latency.add_hline(y=tpot_slo_ms, line={"color": "#444", "dash": "dot", "width": 1},
                          annotation_text=f"SLO {tpot_slo_ms:g} ms", annotation_position="top left")
    goodput = _figure(rows, "request_rate", "request_goodput", "Goodput vs offered rate", "offered rate (req/s)",
                      "goodput (req/s within the SLO)")
    return pareto, latency, goodput


def sweep_cells_table(rows: Sequence[CellRow], caption: str) -> Table:
    out = tuple((r.drafter, r.label, f"{r.request_rate:g}", *(fmt(r.numbers.get(k), spec) for k, spec in (
        ("output_throughput", ".1f"), ("per_user_tokens_per_s", ".1f"), ("p90_ttft_ms", ".0f"),
        ("p90_tpot_ms", ".0f"), ("p90_e2el_ms", ".0f"), ("request_goodput", ".3g"))))
        for r in sorted(rows, key=lambda r: (r.request_rate, r.drafter, r.label)))
    return Table("Cells under open-loop load", ("drafter", "scheduler", "offered req/s", "system tok/s",
                                                "per-user tok/s", "TTFT p90 ms", "TPOT p90 ms", "E2EL p90 ms",
                                                "goodput req/s"), out, caption)


def _sustained(s: tuple[float | None, str] | None) -> str:
    if s is None:
        return "–"
    rate, bound = s
    return {"at_least": f"≥ {fmt(rate, '.3g')}", "below_range": "below the lowest rate"}.get(bound, fmt(rate, ".3g"))


def comparison_table(serving: ServingComparison) -> Table:
    """Each method against the baseline: per-user tokens/s at equal system throughput, the sustained rate."""
    kinds = {"exact": "", "lower_bound": "≥ ", "upper_bound": "≤ "}
    rows = tuple((m.method, serving.baseline, str(len(m.equal_throughput)),
                  "–" if m.ratio_min is None else f"{m.ratio_min:.2f}×–{m.ratio_max:.2f}×",
                  _sustained(m.sustained), _sustained(m.base_sustained),
                  "–" if m.rate_ratio is None else f"{kinds.get(m.rate_ratio_kind or '', '')}{m.rate_ratio:.2f}×")
                 for m in serving.methods)
    slo = f"p90 TPOT ≤ {serving.tpot_slo_ms:g} ms" if serving.tpot_slo_ms else "no TPOT SLO given"
    caption = ("Per-user tok/s ratio: interpolated along each method's per-user vs system frontier at the system "
               "throughputs both reach (smallest–largest). Sustained rate: where p90 TPOT crosses the SLO "
               f"({slo}), interpolated between measured rates; ≥: every rate met it.")
    return Table("Against the baseline at equal load", ("method", "baseline", "common throughputs",
                                                        "per-user tok/s ratio", "sustained req/s",
                                                        "baseline sustained req/s", "rate ratio"), rows, caption)

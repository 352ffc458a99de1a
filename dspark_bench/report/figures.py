"""Plotly figures of a report: each a pure function of recorded numbers, styled by :mod:`.style`.

A series keeps its drafter's colour everywhere; variants of a drafter differ by dash. Measured data are solid
lines with filled markers, simulated data dashed lines with open markers.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from dspark_bench.evaluation.metrics import MIN_ROUNDS
from dspark_bench.report.gains import MIN_PROMPTS, Samples, speedup
from dspark_bench.report.inputs import Calibration, CellRow, Profile
from dspark_bench.report.load import Entry, Inputs
from dspark_bench.report.style import (
    DASHES,
    PATTERNS,
    annotate_empty,
    annotate_note,
    domain_sort_key,
    drafter_colour,
    style_figure,
)
from dspark_bench.report.tables import position_points


def _styles(inputs: Inputs, entries: Sequence[Entry], omit: Sequence[str] = ()) -> dict[str, tuple[str, str, str]]:
    """label -> (colour, dash, bar pattern): the drafter's colour; variants of one drafter differ by dash/pattern."""
    out: dict[str, tuple[str, str, str]] = {}
    seen: dict[str, int] = {}
    for label in inputs.labels(entries, omit):
        drafter = next(e.drafter for e in entries if inputs.label(e, omit) == label)
        n = seen[drafter] = seen.get(drafter, -1) + 1
        out[label] = (drafter_colour(drafter), DASHES[n % len(DASHES)], PATTERNS[n % len(PATTERNS)])
    return out


def _bar_marker(style: tuple[str, str, str]) -> dict:
    return {"color": style[0], "pattern": {"shape": style[2], "fgcolor": "white", "solidity": 0.3}}


def _shades(n: int) -> list[str]:
    """n ordered colours (dark blue to green), for positions or context lengths rather than drafters."""
    return sample_colorscale("Viridis", [0.85 * i / max(n - 1, 1) for i in range(n)])


def _domains(entries: Sequence[Entry]) -> list[str]:
    return sorted({e.name for e in entries}, key=domain_sort_key)


def _panel_ref(col: int) -> tuple[str, str]:
    """The (xref, yref) of panel ``col`` of a one-row figure, for annotations placed in its frame."""
    suffix = "" if col == 1 else str(col)
    return f"x{suffix} domain", f"y{suffix} domain"


def positions_figure(inputs: Inputs, entries: Sequence[Entry]) -> go.Figure:
    """Paper Figure 2: P(x_k accepted | x_1..x_{k-1} accepted) per draft position k, one panel per domain, with
    95% Wilson intervals; positions tested in fewer than ``MIN_ROUNDS`` rounds are left out, and a panel left
    with nothing says so."""
    domains = _domains(entries)
    fig = make_subplots(rows=1, cols=len(domains), subplot_titles=domains, shared_yaxes=True)
    styles, shown = _styles(inputs, entries), set()
    for col, dom in enumerate(domains, 1):
        most, drawn = 0, False  # the most rounds behind a position; whether any is drawn
        for e in (x for x in entries if x.name == dom):
            points = position_points(e.metrics["positions"])  # positions with too few rounds are left out
            y = [p.rate if p.enough else None for p in points]
            up = [(p.interval[1] - p.rate) if p.enough and p.interval else 0.0 for p in points]
            down = [(p.rate - p.interval[0]) if p.enough and p.interval else 0.0 for p in points]
            most = max([most, *(p.examined or 0 for p in points)])
            label = inputs.label(e)
            colour, dash, _ = styles[label]
            fig.add_trace(go.Scatter(
                x=list(range(1, len(points) + 1)), y=y, name=label, legendgroup=label, showlegend=label not in shown,
                mode="lines+markers", line={"color": colour, "dash": dash}, marker={"size": 7},
                error_y={"type": "data", "array": up, "arrayminus": down, "thickness": 1, "width": 3},
                customdata=[p.examined for p in points],
                hovertemplate=f"{label}<br>k=%{{x}}: %{{y:.3f}} of %{{customdata}} tested<extra>{dom}</extra>"),
                row=1, col=col)
            shown.add(label)
            drawn = drawn or any(v is not None for v in y)
        if not drawn:
            annotate_empty(fig, f"No position tested in ≥ {MIN_ROUNDS} rounds<br>(the most: {most}); "
                                "see the table below", *_panel_ref(col))
        fig.update_xaxes(title_text="draft position k", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="conditional acceptance", range=[-0.03, 1.03], row=1, col=1)
    return style_figure(fig, "Conditional acceptance per draft position (paper Figure 2)")


def histogram_figure(inputs: Inputs, entries: Sequence[Entry]) -> go.Figure:
    """Share of rounds with A accepted draft tokens (A = τ_round − 1 unless the round ended on EOS)."""
    fig = go.Figure()
    styles = _styles(inputs, entries)
    for e in entries:
        counts = e.metrics["histogram"]
        total = sum(counts) or 1
        label = inputs.label(e)
        fig.add_trace(go.Bar(x=list(range(len(counts))), y=[c / total for c in counts], name=label,
                             marker=_bar_marker(styles[label]), customdata=counts,
                             hovertemplate=f"{label}<br>A=%{{x}}: %{{y:.1%}} (%{{customdata}} rounds)<extra></extra>"))
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_xaxes(title_text="accepted draft tokens per round, A", dtick=1)
    fig.update_yaxes(title_text="share of rounds", tickformat=".0%")
    return style_figure(fig, "Accepted-length histogram (all prompts)")


def block_size_figure(inputs: Inputs, entries: Sequence[Entry], omit: Sequence[str] = ("block_size", "run")) -> go.Figure:
    """Paper Figure 4: τ against the block size γ, one panel per domain, error bars = 95% bootstrap interval.
    One series per label without ``omit`` (see ``sections.block_size_omit``)."""
    domains = _domains(entries)
    fig = make_subplots(rows=1, cols=len(domains), subplot_titles=domains)
    styles, shown = _styles(inputs, entries, omit), set()
    for col, dom in enumerate(domains, 1):
        for label in inputs.labels(entries, omit):
            pts = sorted(((e.block_size, e.metrics) for e in entries if e.name == dom and inputs.label(e, omit) == label),
                         key=lambda pt: pt[0])
            if not pts:
                continue
            tau = [m.get("tau") for _, m in pts]
            ci = [m.get("tau_ci95") or (t, t) for (_, m), t in zip(pts, tau, strict=True)]
            colour, dash, _ = styles[label]
            fig.add_trace(go.Scatter(
                x=[b for b, _ in pts], y=tau, name=label, legendgroup=label, showlegend=label not in shown,
                mode="lines+markers", line={"color": colour, "dash": dash},
                error_y={"type": "data", "symmetric": False, "array": [c[1] - t for c, t in zip(ci, tau, strict=True)],
                         "arrayminus": [t - c[0] for c, t in zip(ci, tau, strict=True)], "thickness": 1}),
                row=1, col=col)
            shown.add(label)
        fig.update_xaxes(title_text="block size γ (draft tokens per round)", tickvals=sorted({e.block_size for e in entries}),
                         row=1, col=col)
    fig.update_yaxes(title_text="τ (tokens per round)", row=1, col=1)
    return style_figure(fig, "τ against block size (paper Figure 4)")


def _line(fig: go.Figure, x, y, name: str, style: dict, row: int, col: int, shown: set, **extra) -> None:
    """One line+markers trace; the legend lists each name once."""
    options = {"legendgroup": name, "mode": "lines+markers", **style, **extra}
    fig.add_trace(go.Scatter(x=x, y=y, name=name, showlegend=name not in shown, **options), row=row, col=col)
    shown.add(name)


def sweep_figure(rows: Sequence[CellRow]) -> go.Figure:
    """Paper Figure 5: tokens per step and acceptance rate against the static threshold θ (per domain if known)."""
    domains = sorted({r.domain or "all prompts" for r in rows}, key=domain_sort_key)
    fig = make_subplots(rows=2, cols=len(domains), subplot_titles=domains, shared_xaxes=True, vertical_spacing=0.12)
    several = len({r.concurrency for r in rows}) > 1
    shown: set = set()
    for col, dom in enumerate(domains, 1):
        for drafter, conc in dict.fromkeys((r.drafter, r.concurrency) for r in rows):
            pts = sorted((r for r in rows if (r.domain or "all prompts") == dom and (r.drafter, r.concurrency)
                          == (drafter, conc)), key=lambda r: r.theta)
            series = drafter + (f" · c={conc}" if several else "")
            theta, colour = [r.theta for r in pts], drafter_colour(drafter)
            for row, what, key, dash in ((1, "accepted", "accepted_per_step", "solid"),
                                         (1, "rejected", "rejected_per_step", "dot"),
                                         (2, "accepted / verified", "verified_acceptance_rate", "solid")):
                _line(fig, theta, [r.numbers.get(key) for r in pts], f"{series} {what}",
                      {"line": {"color": colour, "dash": dash}}, row, col, shown)
        fig.update_xaxes(title_text="threshold θ", row=2, col=col)
    fig.update_yaxes(title_text="tokens per step", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", row=2)
    fig.update_yaxes(title_text="accepted / verified", row=2, col=1)
    return style_figure(fig, "Static-threshold sweep (paper Figure 5)", height=560)


def _stage_title(cal: Calibration, stage: str) -> str:
    ece, auroc = cal.summary.get(f"ece_{stage}"), cal.summary.get(f"auroc_{stage}")
    parts = ([f"ECE {ece:.1%}"] if ece is not None else []) + ([f"AUROC {auroc:.3f}"] if auroc is not None else [])
    return f"{stage} ({', '.join(parts)})" if parts else stage


def reliability_figure(cal: Calibration) -> go.Figure:
    """Paper Figure 6: observed prefix acceptance against predicted P(A ≥ k), before/after calibration."""
    stages = ["before", *(["after"] if any(p.after for p in cal.positions) else [])]
    fig = make_subplots(rows=1, cols=len(stages), subplot_titles=[_stage_title(cal, st) for st in stages],
                        shared_yaxes=True)
    shades = _shades(len(cal.positions))
    shown: set = set()
    for col, stage in enumerate(stages, 1):
        _line(fig, [0, 1], [0, 1], "perfect calibration", {"line": {"color": "#BBBBBB", "dash": "dash"},
                                                            "mode": "lines"}, 1, col, shown)
        for p, colour in zip(cal.positions, shades, strict=True):
            scores = p.before if stage == "before" else p.after
            if scores is None or not scores.bins:
                continue
            pred, obs, count = zip(*scores.bins, strict=True)
            _line(fig, pred, obs, f"k={p.k}", {"line": {"color": colour}}, 1, col, shown, customdata=count,
                  hovertemplate="pred %{x:.2f} → obs %{y:.2f} (n=%{customdata})<extra></extra>")
        fig.update_xaxes(title_text="predicted P(A ≥ k)", range=[-0.02, 1.02], row=1, col=col)
    fig.update_yaxes(title_text="observed share with A ≥ k", range=[-0.02, 1.02], row=1, col=1)
    return style_figure(fig, f"Reliability of {cal.drafter} confidences (paper Figure 6)")


def profile_figure(profile: Profile) -> go.Figure:
    """Target forward steps per second against batch tokens B, one line per context length."""
    fig = go.Figure()
    for ctx, row, colour in zip(profile.context_lengths, profile.steps_per_s, _shades(len(profile.context_lengths)),
                                strict=True):
        fig.add_trace(go.Scatter(x=profile.batch_tokens, y=row, name=f"context {ctx}", mode="lines+markers",
                                 line={"color": colour}))
    wide = max(profile.batch_tokens) / max(min(profile.batch_tokens), 1) > 20
    fig.update_xaxes(title_text="batch tokens B (tokens per target forward)", type="log" if wide else "linear",
                     tickvals=list(profile.batch_tokens))
    fig.update_yaxes(title_text="SPS (target steps/s)", rangemode="tozero")
    return style_figure(fig, "Profiled step rate SPS(B)" + (f": {profile.where}" if profile.where else ""))


def _load_styles(rows: Sequence[CellRow]) -> dict[tuple[str, str], str]:
    """(drafter, label) -> dash: schedulers of one drafter differ by dash, the same in measured and simulated."""
    out, seen = {}, {}
    for drafter, label in dict.fromkeys((r.drafter, r.label) for r in rows):
        n = seen[drafter] = seen.get(drafter, -1) + 1
        out[(drafter, label)] = DASHES[n % len(DASHES)]
    return out


def load_figure(rows: Sequence[CellRow], unit: str = "tok/s") -> go.Figure:
    """Paper Figures 7-8: throughput against per-request speed, and verify budget against concurrency.
    Measured cells: filled circles; simulated cells: open diamonds, in their own legend group."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput vs per-request speed", "verify budget per request"))
    dashes, shown = _load_styles(rows), set()
    for drafter, label, sim in dict.fromkeys((r.drafter, r.label, r.simulated) for r in rows):
        pts = sorted((r for r in rows if (r.drafter, r.label, r.simulated) == (drafter, label, sim)),
                     key=lambda r: r.concurrency)
        kind = "simulated" if sim else "measured"
        style = {"line": {"color": drafter_colour(drafter), "dash": dashes[(drafter, label)], "width": 1.5 if sim else 2},
                 "marker": {"size": 8, "symbol": "diamond-open" if sim else "circle"}, "legendgroup": kind,
                 "legendgrouptitle_text": kind}
        name, conc = f"{drafter} · {label} ({kind})", [r.concurrency for r in pts]
        _line(fig, [r.numbers.get("per_request_tps") for r in pts], [r.numbers.get("aggregate_tokens_per_s") for r in pts],
              name, style, 1, 1, shown, customdata=conc, hovertemplate="concurrency %{customdata}<extra></extra>")
        _line(fig, conc, [r.numbers.get("mean_verify_budget") for r in pts], name, style, 1, 2, shown)
    fig.update_xaxes(title_text="per-request speed (tok/s per request)", row=1, col=1)
    fig.update_yaxes(title_text=f"aggregate throughput ({unit})", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="concurrent requests", type="log", tickvals=sorted({r.concurrency for r in rows}),
                     row=1, col=2)
    fig.update_layout(legend={"groupclick": "toggleitem"})
    fig.update_yaxes(title_text="tokens verified per request per step", rangemode="tozero", row=1, col=2)
    return style_figure(fig, "Throughput and verify budget under load (paper Figures 7–8)", height=460)


def speed_figure(inputs: Inputs, entries: Sequence[Entry], samples: Samples, note: str = "") -> go.Figure:
    """Speedup over vanilla decoding (`none`) per domain, as recorded, with 95% bootstrap intervals; a speedup
    resting on too few prompts is not drawn (:mod:`.gains`), and the figure says so. ``note``: a line under the
    title (timings from several processes)."""
    domains = _domains(entries)
    fig = go.Figure()
    styles, withheld = _styles(inputs, entries), 0
    for label in inputs.labels(entries):
        found = {e.name: speedup(e, samples) for e in entries if inputs.label(e) == label}
        withheld += sum(g.value is not None and not g.shown for g in found.values())
        drawn = [g if g is not None and g.shown else None for g in map(found.get, domains)]
        fig.add_trace(go.Bar(x=domains, y=[g and g.value for g in drawn], name=label, marker=_bar_marker(styles[label]),
                             error_y={"type": "data", "symmetric": False, "thickness": 1,
                                      "array": [g and g.interval[1] - g.value for g in drawn],
                                      "arrayminus": [g and g.value - g.interval[0] for g in drawn]},
                             hovertemplate=f"{label}<br>%{{x}}: %{{y:.2f}}×<extra></extra>"))
    fig.add_hline(y=1.0, line={"color": "#555555", "width": 1, "dash": "dot"})
    fig.update_layout(barmode="group", bargap=0.3)
    fig.update_xaxes(title_text="domain")
    fig.update_yaxes(title_text="speedup vs none (tokens/s ratio)", rangemode="tozero")
    if all(g is None for t in fig.data for g in t.y):
        annotate_empty(fig, f"No speedup drawn: each rests on fewer than {MIN_PROMPTS} prompts<br>"
                            "or has no per-prompt records (see the table below)", "paper", "paper")
    elif withheld:
        note = "; ".join(filter(None, [note, f"{withheld} bar(s) not drawn: fewer than {MIN_PROMPTS} prompts or no "
                                             "records (see the table below)"]))
    fig = style_figure(fig, "Wall-clock speedup over vanilla decoding")
    if note:
        annotate_note(fig, note)
    return fig

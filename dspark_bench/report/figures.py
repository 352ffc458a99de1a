"""Plotly figures of a report: each a pure function of recorded numbers, styled by :mod:`.style`.

A series keeps its drafter's colour everywhere; variants of a drafter differ by dash. Measured data are solid
lines with filled markers, simulated data dashed lines with open markers.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from dspark_bench.report.inputs import Calibration, LoadSweep, Profile, Sweep
from dspark_bench.report.load import Entry, Inputs
from dspark_bench.report.style import DASHES, domain_sort_key, drafter_colour, style_figure


def _styles(inputs: Inputs, entries: Sequence[Entry], omit: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """label -> (colour, dash): the drafter's colour, one dash per variant of the same drafter."""
    out: dict[str, tuple[str, str]] = {}
    seen: dict[str, int] = {}
    for label in inputs.labels(entries, omit):
        drafter = next(e.drafter for e in entries if inputs.label(e, omit) == label)
        n = seen[drafter] = seen.get(drafter, -1) + 1
        out[label] = (drafter_colour(drafter), DASHES[n % len(DASHES)])
    return out


def _shades(n: int) -> list[str]:
    """n ordered colours (dark blue to green), for positions or context lengths rather than drafters."""
    return sample_colorscale("Viridis", [0.85 * i / max(n - 1, 1) for i in range(n)])


def _domains(entries: Sequence[Entry]) -> list[str]:
    return sorted({e.name for e in entries}, key=domain_sort_key)


def positions_figure(inputs: Inputs, entries: Sequence[Entry]) -> go.Figure:
    """Paper Figure 2: P(x_k accepted | x_1..x_{k-1} accepted) per draft position k, one panel per domain."""
    domains = _domains(entries)
    fig = make_subplots(rows=1, cols=len(domains), subplot_titles=domains, shared_yaxes=True)
    styles, shown = _styles(inputs, entries), set()
    for col, dom in enumerate(domains, 1):
        for e in (x for x in entries if x.name == dom):
            cond = e.metrics["positions"]["conditional"]
            label = inputs.label(e)
            colour, dash = styles[label]
            fig.add_trace(go.Scatter(
                x=list(range(1, len(cond) + 1)), y=cond, name=label, legendgroup=label, showlegend=label not in shown,
                mode="lines+markers", line={"color": colour, "dash": dash}, marker={"size": 7},
                hovertemplate=f"{label}<br>k=%{{x}}: %{{y:.3f}}<extra>{dom}</extra>"), row=1, col=col)
            shown.add(label)
        fig.update_xaxes(title_text="draft position k", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="conditional acceptance", range=[0, 1.02], row=1, col=1)
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
                             marker={"color": styles[label][0]}, customdata=counts,
                             hovertemplate=f"{label}<br>A=%{{x}}: %{{y:.1%}} (%{{customdata}} rounds)<extra></extra>"))
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_xaxes(title_text="accepted draft tokens per round, A", dtick=1)
    fig.update_yaxes(title_text="share of rounds", tickformat=".0%")
    return style_figure(fig, "Accepted-length histogram (all prompts)")


def block_size_figure(inputs: Inputs, entries: Sequence[Entry]) -> go.Figure:
    """Paper Figure 4: τ against the block size γ, one panel per domain, error bars = 95% bootstrap interval."""
    domains = _domains(entries)
    fig = make_subplots(rows=1, cols=len(domains), subplot_titles=domains)
    omit = ("block_size", "run")
    styles, shown = _styles(inputs, entries, omit), set()
    for col, dom in enumerate(domains, 1):
        for label in inputs.labels(entries, omit):
            pts = sorted((e.block_size, e.metrics) for e in entries if e.name == dom and inputs.label(e, omit) == label)
            if not pts:
                continue
            tau = [m.get("tau") for _, m in pts]
            ci = [m.get("tau_ci95") or (t, t) for (_, m), t in zip(pts, tau, strict=True)]
            colour, dash = styles[label]
            fig.add_trace(go.Scatter(
                x=[b for b, _ in pts], y=tau, name=label, legendgroup=label, showlegend=label not in shown,
                mode="lines+markers", line={"color": colour, "dash": dash},
                error_y={"type": "data", "symmetric": False, "array": [c[1] - t for c, t in zip(ci, tau, strict=True)],
                         "arrayminus": [t - c[0] for c, t in zip(ci, tau, strict=True)], "thickness": 1}),
                row=1, col=col)
            shown.add(label)
        fig.update_xaxes(title_text="block size γ (draft tokens per round)", row=1, col=col)
    fig.update_yaxes(title_text="τ (tokens per round)", row=1, col=1)
    return style_figure(fig, "τ against block size (paper Figure 4)")


def sweep_figure(sweeps: Sequence[Sweep]) -> go.Figure:
    """Paper Figure 5: tokens per step and acceptance rate against the static threshold θ, per domain."""
    domains = sorted({p.domain for s in sweeps for p in s.points}, key=domain_sort_key)
    fig = make_subplots(rows=2, cols=len(domains), subplot_titles=domains, shared_xaxes=True, vertical_spacing=0.12)
    shown = set()
    for col, dom in enumerate(domains, 1):
        for s in sweeps:
            pts = sorted((p for p in s.points if p.domain == dom), key=lambda p: p.theta)
            theta, colour = [p.theta for p in pts], drafter_colour(s.drafter)
            for row, name, ys, dash in ((1, "accepted", [p.accepted_per_step for p in pts], "solid"),
                                        (1, "rejected", [p.rejected_per_step for p in pts], "dot"),
                                        (2, "acceptance rate", [p.acceptance_rate for p in pts], "solid")):
                key = f"{s.drafter} {name}"
                fig.add_trace(go.Scatter(x=theta, y=ys, name=key, legendgroup=key, showlegend=key not in shown,
                                         mode="lines+markers", line={"color": colour, "dash": dash}), row=row, col=col)
                shown.add(key)
        fig.update_xaxes(title_text="threshold θ", row=2, col=col)
    fig.update_yaxes(title_text="tokens per step", row=1, col=1)
    fig.update_yaxes(title_text="accepted / verified", tickformat=".0%", row=2, col=1)
    return style_figure(fig, "Static-threshold sweep (paper Figure 5)", height=560)


def _stage_title(cal: Calibration, stage: str) -> str:
    s = (cal.summary or {}).get(stage)
    if s is None:
        return stage
    parts = [f"ECE {s.ece:.1%}" if s.ece is not None else "", f"AUROC {s.auroc:.3f}" if s.auroc is not None else ""]
    return f"{stage} ({', '.join(p for p in parts if p)})"


def reliability_figure(cal: Calibration) -> go.Figure:
    """Paper Figure 6: observed prefix acceptance against predicted cumulative confidence, before/after."""
    stages = [st for st in ("before", "after") if any(c.stage == st for c in cal.reliability)]
    fig = make_subplots(rows=1, cols=len(stages), subplot_titles=[_stage_title(cal, st) for st in stages],
                        shared_yaxes=True)
    ks = sorted({c.k for c in cal.reliability}, key=lambda k: -1 if k is None else k)
    shades = dict(zip(ks, _shades(len(ks)), strict=True))
    for col, stage in enumerate(stages, 1):
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"color": "#BBBBBB", "dash": "dash"},
                                 name="perfect calibration", showlegend=col == 1, legendgroup="diag"), row=1, col=col)
        for c in (c for c in cal.reliability if c.stage == stage):
            name = "all positions" if c.k is None else f"k={c.k}"
            fig.add_trace(go.Scatter(x=c.mean_pred, y=c.frac_pos, name=name, legendgroup=name, showlegend=col == 1,
                                     mode="lines+markers", line={"color": shades[c.k]}, customdata=c.count,
                                     hovertemplate="pred %{x:.2f} → obs %{y:.2f} (n=%{customdata})<extra></extra>"),
                          row=1, col=col)
        fig.update_xaxes(title_text="predicted P(A ≥ k)", range=[0, 1], row=1, col=col)
    fig.update_yaxes(title_text="observed share with A ≥ k", range=[0, 1], row=1, col=1)
    title = f"Reliability of {cal.drafter} confidences, {cal.method} (paper Figure 6)"
    return style_figure(fig, title + (f": {cal.dataset}" if cal.dataset else ""))


def profile_figure(profile: Profile) -> go.Figure:
    """Target forward steps per second against batch tokens B, one line per context length."""
    fig = go.Figure()
    for ctx, row, colour in zip(profile.context_lengths, profile.steps_per_s, _shades(len(profile.context_lengths)),
                                strict=True):
        fig.add_trace(go.Scatter(x=profile.batch_tokens, y=row, name=f"context {ctx}", mode="lines+markers",
                                 line={"color": colour}))
    wide = max(profile.batch_tokens) / max(min(profile.batch_tokens), 1) > 20
    fig.update_xaxes(title_text="batch tokens B (tokens per target forward)", type="log" if wide else "linear")
    fig.update_yaxes(title_text="SPS (target steps/s)", rangemode="tozero")
    where = ", ".join(x for x in (profile.target, profile.device, profile.dtype) if x)
    return style_figure(fig, "Profiled step rate SPS(B)" + (f": {where}" if where else ""))


def load_figure(sweeps: Sequence[LoadSweep]) -> go.Figure:
    """Paper Figures 7-8: throughput against per-user TPS, and verify budget against concurrency."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput vs per-user speed",
                                                        "verify budget per request"))
    unit = sweeps[0].throughput_unit
    points = [p for s in sweeps for p in s.points]
    for drafter in dict.fromkeys(p.drafter for p in points):
        for source in ("measured", "simulated"):
            pts = sorted((p for p in points if p.drafter == drafter and p.source == source), key=lambda p: p.concurrency)
            if not pts:
                continue
            name, colour = f"{drafter} ({source})", drafter_colour(drafter)
            line = {"color": colour, "dash": "solid" if source == "measured" else "dash"}
            marker = {"size": 8, "symbol": "circle" if source == "measured" else "circle-open"}
            conc = [p.concurrency for p in pts]
            fig.add_trace(go.Scatter(x=[p.per_user_tps for p in pts], y=[p.throughput_tok_s for p in pts], name=name,
                                     legendgroup=name, mode="lines+markers", line=line, marker=marker, customdata=conc,
                                     hovertemplate="concurrency %{customdata}<extra></extra>"), row=1, col=1)
            budget = [(c, p.verify_budget) for c, p in zip(conc, pts, strict=True) if p.verify_budget is not None]
            fig.add_trace(go.Scatter(x=[c for c, _ in budget], y=[b for _, b in budget], name=name, legendgroup=name,
                                     showlegend=False, mode="lines+markers", line=line, marker=marker), row=1, col=2)
    fig.update_xaxes(title_text="per-user speed (tok/s per request)", row=1, col=1)
    fig.update_yaxes(title_text=f"aggregate throughput ({unit})", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="concurrent requests", row=1, col=2)
    fig.update_yaxes(title_text="tokens verified per request per step", rangemode="tozero", row=1, col=2)
    return style_figure(fig, "Throughput and verify budget under load (paper Figures 7–8)")


def speed_figure(inputs: Inputs, entries: Sequence[Entry]) -> go.Figure:
    """Speedup over vanilla decoding (`none`) per domain, as recorded."""
    domains = _domains(entries)
    fig = go.Figure()
    styles = _styles(inputs, entries)
    for label in inputs.labels(entries):
        by_dom = {e.name: e.metrics.get("speedup_vs_none") for e in entries if inputs.label(e) == label}
        fig.add_trace(go.Bar(x=domains, y=[by_dom.get(d) for d in domains], name=label,
                             marker={"color": styles[label][0]},
                             hovertemplate=f"{label}<br>%{{x}}: %{{y:.2f}}×<extra></extra>"))
    fig.add_hline(y=1.0, line={"color": "#555555", "width": 1, "dash": "dot"})
    fig.update_layout(barmode="group", bargap=0.3)
    fig.update_xaxes(title_text="domain")
    fig.update_yaxes(title_text="speedup vs none (tokens/s ratio)", rangemode="tozero")
    return style_figure(fig, "Wall-clock speedup over vanilla decoding")

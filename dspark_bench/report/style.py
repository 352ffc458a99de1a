"""Colours, number formats and the shared figure layout: one look for every figure of every report.

A drafter keeps its colour in every figure (Okabe-Ito, colour-blind safe); ``none`` is grey. Variants of
one drafter (another block size, scheduler, target or run) share its colour and differ by line dash
(bar pattern in bar charts).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

DRAFTER_COLOURS = {
    "dspark": "#D55E00",  # vermillion: the method under study
    "dflash": "#0072B2",
    "eagle3": "#009E73",
    "mtp": "#CC79A7",
    "ngram": "#E69F00",
    "none": "#7F7F7F",
}
SPARE_COLOURS = ("#56B4E9", "#8C564B", "#332288", "#AA4499", "#117733", "#999933")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
PATTERNS = ("", "/", ".", "x", "\\", "+")  # bar fill patterns, the dashes of bar charts
DRAFTER_ORDER = ("none", "ngram", "mtp", "eagle3", "dflash", "dspark")
DOMAIN_ORDER = ("math", "code", "chat", "custom")

TAU_DEFINITION = (
    "τ (accepted length) = tokens committed per draft-and-verify round, including the target's own "
    "correction or bonus token, pooled over all rounds of all prompts (so vanilla decoding has τ = 1)."
)
FONT = "Inter, Helvetica, Arial, sans-serif"


def drafter_colour(drafter: str) -> str:
    """Fixed colour of a known drafter; unknown names get a spare colour chosen by a stable hash of the name."""
    if drafter in DRAFTER_COLOURS:
        return DRAFTER_COLOURS[drafter]
    return SPARE_COLOURS[sum(map(ord, drafter)) % len(SPARE_COLOURS)]


def drafter_sort_key(drafter: str) -> tuple[int, str]:
    return (DRAFTER_ORDER.index(drafter) if drafter in DRAFTER_ORDER else len(DRAFTER_ORDER), drafter)


def domain_sort_key(domain: str) -> tuple[int, str]:
    return (DOMAIN_ORDER.index(domain) if domain in DOMAIN_ORDER else len(DOMAIN_ORDER), domain)


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A number for a table cell; a missing value is an en dash."""
    return "–" if value is None else format(value, spec)


def fmt_pct(value: float | None, signed: bool = True) -> str:
    return "–" if value is None else format(value, "+.1%" if signed else ".1%")


def fmt_ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


EMPTY = "empty"  # name of the annotation that says why a figure (or one of its panels) draws nothing
NOTE = "note"  # name of the annotation line under a figure's title


def _has_values(trace) -> bool:
    values = getattr(trace, "y", None)
    return values is not None and any(v is not None and v == v for v in values)  # v == v: not NaN


def annotate_empty(fig: go.Figure, reason: str, xref: str = "x domain", yref: str = "y domain") -> None:
    """Write ``reason`` in the middle of a figure (or, with ``xref``/``yref``, of one panel) that draws nothing."""
    fig.add_annotation(text=reason, name=EMPTY, xref=xref, yref=yref, x=0.5, y=0.5, showarrow=False,
                       font={"size": 13, "color": "#555555"}, bgcolor="#fbf7ee", bordercolor="#eadfc4", borderpad=6)


def annotate_note(fig: go.Figure, text: str) -> None:
    """One grey line between the title and the plot (what a reader must know before reading the bars)."""
    fig.add_annotation(text=text, name=NOTE, xref="paper", yref="paper", x=0, y=1.0, xanchor="left",
                       yanchor="bottom", showarrow=False, align="left", font={"size": 11, "color": "#8a5a00"})


def figure_notes(fig: go.Figure, name: str = EMPTY) -> list[str]:
    """The texts of a figure's annotations named ``name`` (why it, or a panel of it, is empty)."""
    return [a.text for a in fig.layout.annotations if a.name == name]


def style_figure(fig: go.Figure, title: str, height: int = 420, empty: str = "no recorded values to draw") -> go.Figure:
    """The one layout: white background, light grid, legend beside the plot even for one series (so a reader
    knows what is drawn), readable fonts. A figure that draws no value says so (``empty``) in its middle, unless
    its builder already said why."""
    fig.update_layout(
        template="simple_white", title={"text": title, "x": 0.012, "xanchor": "left", "font": {"size": 16}},
        font={"family": FONT, "size": 13}, height=height, margin={"l": 70, "r": 20, "t": 70, "b": 60},
        showlegend=True,
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01, "title": None,
                "font": {"size": 12}},
        hoverlabel={"font": {"family": FONT}},
    )
    fig.update_xaxes(showgrid=True, gridcolor="#EEEEEE", ticks="outside", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", ticks="outside", zeroline=False)
    if not any(_has_values(t) for t in fig.data) and not figure_notes(fig):
        annotate_empty(fig, empty, "paper", "paper")
    return fig

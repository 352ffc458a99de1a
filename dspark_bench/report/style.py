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


def style_figure(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    """The one layout: white background, light grid, legend above the plot, readable fonts."""
    fig.update_layout(
        template="simple_white", title={"text": title, "x": 0.012, "xanchor": "left", "font": {"size": 16}},
        font={"family": FONT, "size": 13}, height=height, margin={"l": 70, "r": 20, "t": 70, "b": 60},
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.01, "title": None,
                "font": {"size": 12}},
        hoverlabel={"font": {"family": FONT}},
    )
    fig.update_xaxes(showgrid=True, gridcolor="#EEEEEE", ticks="outside", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#EEEEEE", ticks="outside", zeroline=False)
    return fig

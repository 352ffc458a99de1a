"""``index.html``: one self-contained page. plotly.js is embedded once in the head (no CDN, works offline);
each figure is a div plus a newPlot call. A last script records on ``<html>`` how many figures rendered and
how many script errors happened, which ``recipes/screenshot_report.sh`` checks in headless Chromium."""

from __future__ import annotations

import html
from collections.abc import Sequence

from plotly.offline import get_plotlyjs

from dspark_bench.report.sections import Missing, Section
from dspark_bench.report.style import FONT, TAU_DEFINITION
from dspark_bench.report.tables import Table

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "png", "scale": 2}}

_CSS = f"""
body {{ font-family: {FONT}; color: #222; margin: 0; background: #fff; }}
main {{ max-width: 1240px; margin: 0 auto; padding: 24px 32px 64px; }}
h1 {{ font-size: 26px; margin: 8px 0 4px; }} h2 {{ font-size: 20px; margin: 40px 0 8px;
  border-bottom: 1px solid #ddd; padding-bottom: 4px; }} h3 {{ font-size: 15px; margin: 20px 0 6px; }}
p.meta, p.caption, .note {{ color: #555; font-size: 14px; line-height: 1.45; }}
.tau {{ background: #f6f6f6; border-left: 3px solid #D55E00; padding: 8px 12px; font-size: 14px; }}
nav ol {{ columns: 2; font-size: 14px; }} nav a {{ color: #0072B2; text-decoration: none; }}
.missing {{ background: #fbf7ee; border: 1px solid #eadfc4; padding: 8px 16px; font-size: 14px; }}
.scroll {{ overflow-x: auto; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 6px 0 4px; font-variant-numeric: tabular-nums; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }}
th {{ background: #fafafa; font-weight: 600; }} th.group {{ text-align: center; border-bottom: 2px solid #ccc; }}
td:first-child, th:first-child, .text {{ text-align: left; }} td.text {{ white-space: normal; max-width: 760px; }}
.figure {{ margin: 12px 0; }}
"""

_ERRORS_JS = """(function () {
  var root = document.documentElement, original = console.error;
  function bump() { root.setAttribute('data-js-errors', String(Number(root.getAttribute('data-js-errors') || 0) + 1)); }
  window.addEventListener('error', bump);
  window.addEventListener('unhandledrejection', bump);
  console.error = function () { bump(); return original.apply(console, arguments); };
})();"""

_CHECK_JS = """window.addEventListener('load', function () { setTimeout(function () {
  var root = document.documentElement, figs = document.querySelectorAll('.plotly-graph-div'), ok = 0;
  figs.forEach(function (d) { if (d.querySelector('.main-svg') && d.querySelector('g.trace, g.traces')) { ok += 1; } });
  root.setAttribute('data-figures-total', String(figs.length));
  root.setAttribute('data-figures-rendered', String(ok));
  root.setAttribute('data-page-height', String(root.scrollHeight));
  if (!root.hasAttribute('data-js-errors')) { root.setAttribute('data-js-errors', '0'); }
}, 200); });"""

_esc = html.escape


def table_html(t: Table) -> str:
    """A table; columns whose cells are all numbers are right-aligned, text columns left-aligned."""
    text = t.text_columns()

    def cls(i: int) -> str:
        return ' class="text"' if i in text else ""

    head = ""
    if t.groups:
        head = "<tr>" + "".join(f'<th class="group" colspan="{w}">{_esc(g)}</th>' for g, w in t.groups) + "</tr>"
    head += "<tr>" + "".join(f"<th{cls(i)}>{_esc(c)}</th>" for i, c in enumerate(t.columns)) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{_esc(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in t.rows)
    caption = f'<p class="caption">{_esc(t.caption)}</p>' if t.caption else ""
    return (f"<h3>{_esc(t.title)}</h3><div class=scroll><table><thead>{head}</thead><tbody>{body}</tbody></table>"
            f"</div>{caption}")


def section_html(s: Section) -> str:
    parts = [f'<section id="{s.key}"><h2>{_esc(s.title)}</h2>']
    if s.caption:
        parts.append(f'<p class="caption">{_esc(s.caption)}</p>')
    for i, fig in enumerate(s.figures, 1):
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{s.key}-{i}", config=PLOTLY_CONFIG,
                          default_width="100%")
        parts.append(f'<div class="figure">{div}</div>')
    parts += [table_html(t) for t in s.tables]
    return "".join(parts) + "</section>"


def _missing_html(missing: Sequence[Missing]) -> str:
    if not missing:
        return ""
    items = "".join(f"<li><b>{_esc(m.title)}</b>: {_esc(m.reason)}</li>" for m in missing)
    return f'<section id="missing" class="missing"><b>Not in this report</b> (no data):<ul>{items}</ul></section>'


def render_html(title: str, meta: str, sections: Sequence[Section], missing: Sequence[Missing]) -> str:
    toc = "".join(f'<li><a href="#{s.key}">{_esc(s.title)}</a></li>' for s in sections)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>", f"<script>{_ERRORS_JS}</script>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>', "</head><body><main>",
        f"<h1>{_esc(title)}</h1>", f'<p class="meta">{_esc(meta)}</p>', f'<p class="tau">{_esc(TAU_DEFINITION)}</p>',
        f"<nav><ol>{toc}</ol></nav>", _missing_html(missing), *(section_html(s) for s in sections),
        f"<script>{_CHECK_JS}</script>", "</main></body></html>",
    ])

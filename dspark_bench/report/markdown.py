"""``report.md``: the tables of the report in GitHub Markdown, short enough for a CI job summary, with links
to the PNG figures when they were exported (the interactive figures live in ``index.html``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dspark_bench.report.sections import Missing, Section
from dspark_bench.report.style import TAU_DEFINITION, figure_notes
from dspark_bench.report.tables import Table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> str:
    text = t.text_columns()
    lines = [f"**{_cell(t.title)}**", "", "| " + " | ".join(_cell(c) for c in t.columns) + " |",
             "|" + "|".join("---" if i in text else "---:" for i in range(len(t.columns))) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    if t.caption:
        lines += ["", f"<sub>{_cell(t.caption)}</sub>"]
    return "\n".join(lines)


def section_md(s: Section, pngs: Sequence[Path], out_dir: Path) -> str:
    parts = [f"## {s.title}", ""]
    if s.caption:
        parts += [s.caption, ""]
    for png in pngs:
        parts += [f"![{s.title}]({png.relative_to(out_dir).as_posix()})", ""]
    if s.figures and not pngs:
        parts += [f"_{len(s.figures)} interactive figure(s) in index.html._", ""]
        for i, fig in enumerate(s.figures, 1):  # what the figure itself says in its middle
            for why in figure_notes(fig):
                parts += [f"_Figure {i}: {_cell(why.replace('<br>', ' '))}._", ""]
    for t in s.tables:
        parts += [table_md(t), ""]
    return "\n".join(parts)


def render_markdown(title: str, meta: str, sections: Sequence[Section], missing: Sequence[Missing],
                    pngs: Mapping[str, Sequence[Path]], out_dir: Path, png_note: str | None) -> str:
    parts = [f"# {title}", "", meta, "", f"> {TAU_DEFINITION}", ""]
    if png_note:
        parts += [f"_Figures: {png_note}_", ""]
    parts += [section_md(s, pngs.get(s.key, ()), out_dir) for s in sections]
    if missing:
        parts += ["## Not in this report", ""] + [f"- **{m.title}**: {m.reason}" for m in missing] + [""]
    return "\n".join(parts)

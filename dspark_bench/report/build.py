"""``build_report``: read recorded results, lay out the sections, write index.html, report.md and PNGs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.report.export import export_pngs
from dspark_bench.report.html import render_html
from dspark_bench.report.load import Inputs, load_inputs
from dspark_bench.report.markdown import render_markdown
from dspark_bench.report.sections import Missing, Section, build_sections

FIGURES_DIR = "figures"


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    html: Path
    markdown: Path
    pngs: tuple[Path, ...]
    sections: tuple[str, ...]  # keys of the sections present
    missing: tuple[Missing, ...]  # sections without data, with the reason
    png_note: str | None  # why PNGs were not written; None when they were (or were not asked for)


def _meta(inputs: Inputs) -> str:
    runs = ", ".join(r.name for r in inputs.runs) or "none"
    files = ", ".join(f"{a.source.parent.name}/{a.source.name}" for docs in inputs.artifacts.values() for a in docs)
    targets = ", ".join(dict.fromkeys(r.target for r in inputs.runs)) or "–"
    unfinished = [r.name for r in inputs.runs if r.summary_source != "summary.json"]
    warn = f" Unfinished runs (numbers re-aggregated from records.jsonl): {', '.join(unfinished)}." if unfinished else ""
    return (f"Generated {time.strftime('%Y-%m-%d %H:%M %Z')}. Target(s): {targets}. Runs: {runs}. "
            f"Other inputs: {files or 'none'}.{warn}{_dirty_warning(inputs)}")


def _dirty_warning(inputs: Inputs) -> str:
    """One sentence naming the runs recorded from a working tree with uncommitted changes (no commit holds the
    code that produced their numbers), or nothing."""
    dirty = {r.name: r.dirty_sources() for r in inputs.runs if r.dirty_sources()}
    if not dirty:
        return ""
    listed = "; ".join(f"{name} ({', '.join(src)})" for name, src in dirty.items())
    return (f" Warning: recorded from a git working tree with uncommitted changes, so no commit holds the exact "
            f"code behind these numbers: {listed}.")


def _png_paths(sections: Sequence[Section], out_dir: Path) -> dict[str, list[Path]]:
    return {s.key: [out_dir / FIGURES_DIR / f"{s.key}-{i}.png" for i in range(1, len(s.figures) + 1)]
            for s in sections if s.figures}


def build_report(runs: Sequence[Path], out_dir: Path, png: bool = True, title: str | None = None) -> ReportResult:
    """Report over run folders and result files. With ``png`` the figures are also written as PNGs when kaleido
    and Chromium are available; otherwise ``png_note`` says once why not."""
    # 1. read and lay out
    inputs = load_inputs([Path(p) for p in runs])
    sections, missing = build_sections(inputs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = title or f"dspark-bench report: {out_dir.resolve().name}"
    meta = _meta(inputs)
    # 2. static figures, if an exporter is here
    wanted, written, note = _png_paths(sections, out_dir), {}, None
    if png:
        note = export_pngs([(p, f) for s in sections for p, f in zip(wanted.get(s.key, []), s.figures, strict=True)])
        written = {} if note else wanted
    # 3. the two documents
    html_path, md_path = out_dir / "index.html", out_dir / "report.md"
    html_path.write_text(render_html(title, meta, sections, missing), encoding="utf-8")
    md_path.write_text(render_markdown(title, meta, sections, missing, written, out_dir, note), encoding="utf-8")
    pngs = tuple(p for v in written.values() for p in v)
    return ReportResult(out_dir, html_path, md_path, pngs, tuple(s.key for s in sections), tuple(missing), note)

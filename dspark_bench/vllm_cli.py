"""Command-line edge of the vLLM engine: ``run --engine vllm`` (called from ``cli.run``)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from dspark_bench.cli_common import console, friendly, parse_limit, parse_options, stdout

VLLM_DEFAULT_DRAFTERS = ("none", "ngram")


def run_vllm(target, drafter_list, drafter_opt, scheduler, profile_path, suite, limit, skip, max_new_tokens,
             temperature, block_size, seed, dtype, repeats, concurrency, out, cache_dir, engine_opt) -> None:
    """``run --engine vllm``: the same prompts, seeds and run folder as ``run``, decoded by vLLM."""
    from dspark_bench.cli import _print_summary, _RunProgress
    from dspark_bench.engine import EngineConfig
    from dspark_bench.runner import RunSpec
    from dspark_bench.suites import load_suite
    from dspark_bench.vllm_engine import METHODS, VllmError, parse_engine_options
    from dspark_bench.vllm_run import VllmRun

    names = tuple(d.strip() for d in drafter_list.split(",") if d.strip()) if drafter_list else VLLM_DEFAULT_DRAFTERS
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    if repeats < 1:
        raise click.BadParameter(f"--repeats must be >= 1, got {repeats}")
    EngineConfig(max_new_tokens, temperature, block_size, concurrency)  # validates the numbers early
    spec = RunSpec(target=target, drafters=names, drafter_options=parse_options(drafter_opt), scheduler=scheduler,
                   profile=profile_path, suite=suite, limit=parse_limit(limit), skip=skip,
                   max_new_tokens=max_new_tokens, temperature=temperature, block_size=block_size, seed=seed,
                   dtype=dtype, repeats=repeats, concurrency=concurrency)
    prompts = load_suite(suite, spec.limit, skip=skip)
    if not prompts:
        raise click.BadParameter(f"--skip {skip} leaves no prompt of {suite!r}")
    folder = Path(out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{Path(target).name}-vllm")
    run = VllmRun(spec, prompts, folder, parse_engine_options(engine_opt),
                  Path(cache_dir) if cache_dir else None, on_status=lambda msg: console.print(msg))
    with _RunProgress(len(prompts) * len(names) * repeats, names) as progress:
        run.on_record = progress.update
        summary = run.execute()
    _print_summary(summary)
    stdout.print("system tokens/s (output tokens / generate wall time): "
                 + ", ".join(f"{n} {v:.1f}" for n, v in summary["system_tokens_per_s"].items() if v))
    stdout.print(f"results written to [bold]{folder}[/]")


def check_lossless_vllm(target, drafter_list, mode, seed, out, engine_opt) -> None:
    """``check-lossless --engine vllm``: the battery's table and lossless.json for vLLM's configurations."""
    import json
    import sys

    from rich.table import Table

    from dspark_bench.stats import HEADERS, render_rows, report_to_json
    from dspark_bench.target import resolve_target
    from dspark_bench.vllm_engine import (
        METHODS,
        VllmError,
        option_fields,
        parse_engine_options,
        platform_defaults,
        require_vllm,
        split_engine_options,
    )
    from dspark_bench.vllm_lossless import run_vllm_battery

    require_vllm()
    names = [d.strip() for d in (drafter_list or "none,ngram").split(",") if d.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    llm_opts, spec_opts = split_engine_options(parse_engine_options(engine_opt), *option_fields())
    if spec_opts:
        raise VllmError(f"check-lossless --engine vllm takes EngineArgs options only, not {sorted(spec_opts)}")
    llm_opts = {**platform_defaults(), **llm_opts}
    report, evidence = run_vllm_battery(mode, target, names, seed, resolve_target(target), llm_opts,
                                        progress=lambda msg: console.print(f"[dim]{msg}[/]"))
    table = Table(title=f"vLLM lossless check ({mode}, {target}): every configuration must pass")
    for col in HEADERS:
        table.add_column(col)
    for row in render_rows(report):
        table.add_row(*row)
    stdout.print(table)
    folder = Path(out) if out else Path(f"results/lossless-vllm-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    from dspark_bench.vllm_engine import vllm_version

    data = {**report_to_json(report), "engine": {"name": "vllm", "version": vllm_version()}, "evidence": evidence}
    (folder / "lossless.json").write_text(json.dumps(data, indent=2) + "\n")
    verdict = "[green]ok[/]" if report.ok else "[bold red]FAILED[/] (a configuration failed: see its evidence)"
    stdout.print(f"{verdict}; written to {folder / 'lossless.json'}")
    sys.exit(0 if report.ok else 1)


@click.command(name="export")
@click.option("--format", "fmt", required=True, type=click.Choice(["vllm"]),
              help="vllm: the layout vLLM's llama_eagle3 loads (speculative method eagle3, model=OUT).")
@click.option("--drafter", default="eagle3", show_default=True, type=click.Choice(["eagle3"]))
@click.option("--target", default="smollm2-135m", show_default=True, help="The target the drafter was trained for.")
@click.option("--checkpoint", "source", default=None, type=click.Path(path_type=Path),
              help="Our checkpoint folder. Default: the shipped one for --target.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to write.")
@friendly
def export(fmt, drafter, target, source, out):
    """Write a trained drafter in another engine's checkpoint layout."""
    from dspark_bench.drafters.checkpoint import shipped_folder
    from dspark_bench.target import resolve_target
    from dspark_bench.vllm_export import export_vllm

    source = source or shipped_folder(Path(target).name, drafter)
    if source is None:
        raise click.BadParameter(f"no shipped {drafter} checkpoint for {target}: give --checkpoint")
    folder = export_vllm(Path(source), Path(resolve_target(target)), out)
    stdout.print(f"{drafter} from {source} written to [bold]{folder}[/] (vLLM: --drafter {drafter} "
                 f"--drafter-opt {drafter}.model={folder})")

"""Command-line edge of the vLLM engine: ``run --engine vllm`` (called from ``cli.run``)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.markup import escape

from dspark_bench.cli_common import (
    DTYPE_OPTION,
    battery_table,
    console,
    friendly,
    parse_limit,
    parse_options,
    stdout,
)

VLLM_DEFAULT_DRAFTERS = ("none", "ngram")


def with_shipped_exports(spec, folder: Path, cache_dir: Path | None = None):
    """``spec`` with ``eagle3.model`` pointing at our shipped eagle3 for the target, exported to vLLM's layout in
    ``folder/vllm-drafters/eagle3``, where eagle3 is asked for without a model of its own."""
    import dataclasses

    from dspark_bench.drafters.checkpoint import shipped_folder
    from dspark_bench.target import resolve_target
    from dspark_bench.vllm_export import export_vllm

    opts = {k: dict(v) for k, v in spec.drafter_options.items()}
    for name in spec.drafters:
        shipped = shipped_folder(Path(spec.target).name, name) if name == "eagle3" else None
        if shipped and not ({"model", "checkpoint"} & set(opts.get(name, {}))):
            exported = export_vllm(shipped, Path(resolve_target(spec.target, cache_dir)),
                                   Path(folder) / "vllm-drafters" / name)
            opts.setdefault(name, {})["model"] = str(exported)
            console.print(f"{name}: our shipped checkpoint, exported for vLLM to {exported}")
    return dataclasses.replace(spec, drafter_options=opts)


def lossless_options(engine_opt, command: str) -> tuple[tuple[str, ...], dict]:
    """(fixes, ``LLM`` options) of a vLLM lossless check from ``--engine-opt``: EngineArgs fields and ``fix``."""
    from dspark_bench.vllm_engine import VllmError, parse_engine_options, split_options

    fixes, llm_opts, spec_opts = split_options(parse_engine_options(engine_opt))
    if spec_opts:
        raise VllmError(f"{command} takes EngineArgs options and fix= only, not {sorted(spec_opts)}")
    return fixes, llm_opts


def engine_facts(fixes, speculative: bool) -> dict:
    """lossless.json's ``engine``: vLLM's version and its known bugs (present? fixed?), warning on stderr about
    an unfixed one that makes this check's speculative configurations lossy (T = 1)."""
    from dspark_bench.vllm_engine import vllm_version
    from dspark_bench.vllm_fixes import facts, warnings_for

    bugs = facts(fixes)
    for line in warnings_for(bugs, speculative):
        console.print(f"[bold yellow]warning:[/] {escape(line)}")
    return {"name": "vllm", "version": vllm_version(), "known_bugs": bugs}


def run_vllm(target, drafter_list, drafter_opt, scheduler, profile_path, suite, limit, skip, max_new_tokens,
             temperature, block_size, seed, dtype, repeats, concurrency, out, cache_dir, engine_opt) -> None:
    """``run --engine vllm``: the same prompts, seeds and run folder as ``run``, decoded by vLLM."""
    from dspark_bench.cli import _print_summary, _RunProgress, resolve_block_size
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
    # num_speculative_tokens: --block-size, else what the drafters' checkpoints (ours, exported) were trained for
    block_size = resolve_block_size(block_size, names, parse_options(drafter_opt), target)
    EngineConfig(max_new_tokens, temperature, block_size, concurrency)  # validates the numbers early
    spec = RunSpec(target=target, drafters=names, drafter_options=parse_options(drafter_opt), scheduler=scheduler,
                   profile=profile_path, suite=suite, limit=parse_limit(limit), skip=skip,
                   max_new_tokens=max_new_tokens, temperature=temperature, block_size=block_size, seed=seed,
                   dtype=dtype, repeats=repeats, concurrency=concurrency)
    prompts = load_suite(suite, spec.limit, skip=skip)
    if not prompts:
        raise click.BadParameter(f"--skip {skip} leaves no prompt of {suite!r}")
    folder = Path(out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{Path(target).name}-vllm")
    spec = with_shipped_exports(spec, folder, Path(cache_dir) if cache_dir else None)
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

    from dspark_bench.stats import report_to_json
    from dspark_bench.target import resolve_target
    from dspark_bench.vllm_engine import METHODS, VllmError, require_vllm
    from dspark_bench.vllm_lossless import run_vllm_battery

    require_vllm()
    names = [d.strip() for d in (drafter_list or "none,ngram").split(",") if d.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    fixes, llm_opts = lossless_options(engine_opt, "check-lossless --engine vllm")
    folder = Path(out) if out else Path(f"results/lossless-vllm-{time.strftime('%Y%m%d-%H%M%S')}")
    from dspark_bench.runner import RunSpec

    exports = with_shipped_exports(RunSpec(target=target, drafters=tuple(names)), folder).drafter_options
    report, evidence = run_vllm_battery(mode, target, names, seed, resolve_target(target), llm_opts,
                                        progress=lambda msg: console.print(f"[dim]{msg}[/]"), drafter_options=exports,
                                        fixes=fixes)
    stdout.print(battery_table(report, f"vLLM lossless check ({mode}, {target}): every configuration must pass"))
    folder.mkdir(parents=True, exist_ok=True)
    data = {**report_to_json(report), "engine": engine_facts(fixes, any(n != "none" for n in names)),
            "evidence": evidence}
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


@click.command(name="compare-engines")
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--drafter", "drafter_list", default="none,ngram,eagle3", show_default=True,
              help="Comma list; each runs through both engines where both serve it (eagle3: our shipped "
                   "checkpoint, exported for vLLM), otherwise through ours only.")
@click.option("--suite", default="all", show_default=True)
@click.option("--limit", default="2", show_default=True, help="Prompts per dataset, or 'all'.")
@click.option("--max-new-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", default=1.0, show_default=True, type=float)
@click.option("--block-size", default=3, show_default=True, type=int)
@click.option("--seed", default=980406, show_default=True, type=int)
@DTYPE_OPTION
@click.option("--concurrency", default=1, show_default=True, type=int)
@click.option("--lossless", "lossless_mode", default=None, type=click.Choice(["fast", "thorough"]),
              help="Also run each engine's lossless check on the drafters (ours: scheduler fixed).")
@click.option("--engine-opt", multiple=True, help="vLLM option KEY=VALUE (as for run --engine vllm).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for both runs and compare.md.")
@friendly
def compare_engines(target, drafter_list, suite, limit, max_new_tokens, temperature, block_size, seed, dtype,
                    concurrency, lossless_mode, engine_opt, out):
    """The same prompts and seeds through our engine and vLLM; tau, per-position acceptance and lossless verdicts
    side by side in OUT/compare.md."""
    from dspark_bench.engine_compare import write_comparison
    from dspark_bench.runner import Run, RunSpec
    from dspark_bench.suites import load_suite
    from dspark_bench.target import Target, resolve_dtype
    from dspark_bench.vllm_engine import CHECKPOINT_METHODS, METHODS, parse_engine_options, require_vllm
    from dspark_bench.vllm_run import VllmRun

    require_vllm()
    dtype = resolve_dtype(dtype)
    names = tuple(d.strip() for d in drafter_list.split(",") if d.strip())
    base = RunSpec(target=target, drafters=names, suite=suite, limit=parse_limit(limit), max_new_tokens=max_new_tokens,
                   temperature=temperature, block_size=block_size, seed=seed, dtype=dtype, concurrency=concurrency)
    prompts = load_suite(suite, base.limit)
    ours = with_shipped_exports(base, out / "vllm")
    served = tuple(d for d in names if d in METHODS and (d not in CHECKPOINT_METHODS
                                                          or "model" in ours.drafter_options.get(d, {})))
    console.print(f"our engine: {', '.join(names)}; vLLM: {', '.join(served)}")
    tgt = Target.load(target, dtype=dtype)
    Run(base, tgt, prompts, out / "dspark").execute()
    del tgt
    import dataclasses

    vspec = dataclasses.replace(ours, drafters=served)
    VllmRun(vspec, prompts, out / "vllm", parse_engine_options(engine_opt),
            on_status=lambda msg: console.print(msg)).execute()
    if lossless_mode:
        _lossless_both(target, names, served, lossless_mode, seed, out, ours, engine_opt)
    rows = write_comparison(out, names, f"{target}: our engine vs vLLM (T={temperature}, k={block_size})")
    stdout.print((out / "compare.md").read_text())
    stdout.print(f"{len(rows)} rows; runs in [bold]{out}/dspark[/] and [bold]{out}/vllm[/]")


def _lossless_both(target, names, served, mode, seed, out: Path, spec, engine_opt) -> None:
    """Each engine's lossless check of the compared drafters, as ``lossless.json`` in its run folder."""
    import json

    from dspark_bench.stats import report_to_json, run_battery
    from dspark_bench.target import resolve_target
    from dspark_bench.vllm_lossless import run_vllm_battery

    fixes, llm_opts = lossless_options(engine_opt, "compare-engines --lossless")

    say = (lambda msg: console.print(f"[dim]{msg}[/]"))  # noqa: E731
    ours = run_battery(mode=mode, target=target, drafters=list(names), schedulers=["fixed"], seed=seed, progress=say)
    (out / "dspark" / "lossless.json").write_text(json.dumps(report_to_json(ours), indent=2) + "\n")
    report, evidence = run_vllm_battery(mode, target, served, seed, resolve_target(target), llm_opts,
                                        progress=say, drafter_options=spec.drafter_options, fixes=fixes)
    data = {**report_to_json(report), "engine": engine_facts(fixes, any(n != "none" for n in served)),
            "evidence": evidence}
    (out / "vllm" / "lossless.json").write_text(json.dumps(data, indent=2) + "\n")

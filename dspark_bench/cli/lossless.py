"""``dspark-bench check-lossless``: the lossless check of an engine (:mod:`dspark_bench.lossless.engines`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from dspark_bench.cli.common import battery_table, console, friendly, stdout
from dspark_bench.cli.run import check_out_folder


@click.command(name="check-lossless")
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--drafter", "drafter_list", default=None,
              help="Comma list of drafters. Default: every registered one (vllm: none,ngram).")
@click.option("--scheduler", "scheduler_list", default=None,
              help="Comma list of schedulers (our engine). Default: every registered one.")
@click.option("--mode", default="fast", show_default=True, type=click.Choice(["fast", "thorough"]))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Folder for lossless.json (e.g. a run folder). Default: results/lossless[-ENGINE]-<time>/.")
@click.option("--engine", default="dspark", show_default=True,
              help="dspark (ours: drafters x schedulers, with negative controls), vllm (PIT/KS against the "
                   "teacher-forced target and homogeneity against vLLM without speculation, per configuration) or "
                   "openai (a running server at --base-url: PIT/KS and first-token goodness of fit against the "
                   "teacher-forced target).")
@click.option("--engine-opt", multiple=True,
              help="With --engine vllm: an EngineArgs option KEY=VALUE, fix=NAME (a known vLLM bug's fix) or "
                   "fault=NAME (a deliberate bug, a negative control; dspark_bench/engines/vllm/fixes.py).")
@click.option("--base-url", default=None, help="Engine openai: the server, e.g. http://127.0.0.1:8000/v1.")
@click.option("--model", "served_model", default=None,
              help="Engine openai: the served model name (default: the server's first model).")
@click.option("--api-key-env", default=None,
              help="Engine openai: the environment variable holding an API key (never written down).")
@click.option("--server-spec", default=None,
              help="Engine openai: the server's speculation, as the JSON given to vLLM's --speculative-config, or "
                   "none. Default: read from the server's vLLM /metrics (the verified row then needs this option).")
@click.option("--request-timeout", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Engine openai: seconds before a request counts as failed.")
@friendly
def check_lossless(target, drafter_list, scheduler_list, mode, seed, out, engine, engine_opt, base_url, served_model,
                   api_key_env, server_spec, request_timeout):
    """Statistical battery: speculative decoding must reproduce the target law; negative controls must fail.

    Exit status: 0 ok, 1 failed, 3 inconclusive (a check sampled too little of the speculative path to state its
    power), 2 bad input."""
    from dspark_bench.lossless import report_to_json
    from dspark_bench.lossless.engines import Request, lossless_check
    from dspark_bench.lossless.server import ServerOptions
    from dspark_bench.scheduling.schedulers import split_schedulers

    check = lossless_check(engine)
    named = [o for o, v in (("--model", served_model), ("--api-key-env", api_key_env),
                            ("--server-spec", server_spec)) if v is not None]
    if named and base_url is None:
        raise click.BadParameter(f"{', '.join(named)} describe a server: give them with --engine openai --base-url")
    server = ServerOptions(base_url, served_model, api_key_env, server_spec, request_timeout) if base_url else None
    suffix = "" if engine == "dspark" else f"-{engine}"
    folder = Path(out) if out else Path(f"results/lossless{suffix}-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_folder(folder)  # before the battery: its results must have somewhere to go
    drafters = tuple(x.strip() for x in drafter_list.split(",") if x.strip()) if drafter_list else None
    schedulers = tuple(split_schedulers(scheduler_list)) if scheduler_list else None  # commas in [...] stay
    outcome = check(Request(target, mode, seed, folder, drafters, schedulers, tuple(engine_opt), server),
                    lambda msg: console.print(f"[dim]{escape(msg)}[/]"))
    stdout.print(battery_table(outcome.report, outcome.title))
    folder.mkdir(parents=True, exist_ok=True)
    data = {**report_to_json(outcome.report), **outcome.extra}
    (folder / "lossless.json").write_text(json.dumps(data, indent=2) + "\n")
    verdict = {"ok": "[green]ok[/]", "fail": f"[bold red]FAILED[/] ({outcome.failure})",
               "inconclusive": "[bold yellow]INCONCLUSIVE[/] (too little of the speculative path was sampled to "
                               "state the check's power: see the rows' detail)"}[outcome.report.verdict]
    stdout.print(f"{verdict}; written to {folder / 'lossless.json'}")
    sys.exit({"ok": 0, "fail": 1, "inconclusive": 3}[outcome.report.verdict])

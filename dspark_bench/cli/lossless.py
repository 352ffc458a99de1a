"""``dspark-bench check-lossless``: the lossless battery for our engine, and its counterpart for vLLM."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.markup import escape

from dspark_bench.cli.common import battery_table, console, friendly, stdout
from dspark_bench.cli.run import check_out_folder


@click.command(name="check-lossless")
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
              help="With --engine vllm: an EngineArgs option KEY=VALUE, or fix=NAME (dspark_bench/engines/vllm/fixes.py).")
@friendly
def check_lossless(target, drafter_list, scheduler_list, mode, seed, out, engine, engine_opt):
    """Statistical battery: speculative decoding must reproduce the target law; negative controls must fail."""
    import json

    if engine == "vllm":
        if scheduler_list:
            raise click.BadParameter("--scheduler is ours: vLLM verifies every drafted token")
        return check_lossless_vllm(target, drafter_list, mode, seed, out, engine_opt)
    folder = out or Path(f"results/lossless-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_folder(folder)  # before the battery: its results must have somewhere to go

    from dspark_bench.lossless import report_to_json, run_battery
    from dspark_bench.scheduling.schedulers import split_schedulers

    if engine_opt:
        raise click.BadParameter("--engine-opt configures vLLM: give it with --engine vllm")
    drafters = [x.strip() for x in drafter_list.split(",") if x.strip()] if drafter_list else None
    schedulers = list(split_schedulers(scheduler_list)) if scheduler_list else None  # commas in [...] stay
    report = run_battery(mode=mode, target=target, drafters=drafters, schedulers=schedulers,
                         seed=seed, progress=lambda msg: console.print(f"[dim]{msg}[/]"))
    stdout.print(battery_table(report, f"lossless battery ({mode}, {target}): real configurations must pass, "
                                       "controls must fail"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lossless.json").write_text(json.dumps(report_to_json(report), indent=2) + "\n")
    verdict = "[green]ok[/]" if report.ok else "[bold red]FAILED[/] (a real configuration failed or a control passed)"
    stdout.print(f"{verdict}; written to {folder / 'lossless.json'}")
    sys.exit(0 if report.ok else 1)


def lossless_options(engine_opt, command: str) -> tuple[tuple[str, ...], dict]:
    """(fixes, ``LLM`` options) of a vLLM lossless check from ``--engine-opt``: EngineArgs fields and ``fix``."""
    from dspark_bench.engines.vllm.llm import VllmError, parse_engine_options, split_options

    fixes, llm_opts, spec_opts = split_options(parse_engine_options(engine_opt))
    if spec_opts:
        raise VllmError(f"{command} takes EngineArgs options and fix= only, not {sorted(spec_opts)}")
    return fixes, llm_opts


def engine_facts(fixes, speculative: bool) -> dict:
    """lossless.json's ``engine``: vLLM's version and its known bugs (present? fixed?), warning on stderr about
    an unfixed one that makes this check's speculative configurations lossy (T = 1)."""
    from dspark_bench.engines.vllm.fixes import facts, warnings_for
    from dspark_bench.engines.vllm.llm import vllm_version

    bugs = facts(fixes)
    for line in warnings_for(bugs, speculative):
        console.print(f"[bold yellow]warning:[/] {escape(line)}")
    return {"name": "vllm", "version": vllm_version(), "known_bugs": bugs}


def check_lossless_vllm(target, drafter_list, mode, seed, out, engine_opt) -> None:
    """``check-lossless --engine vllm``: the battery's table and lossless.json for vLLM's configurations."""
    import json
    import sys

    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.vllm.export import with_shipped_exports
    from dspark_bench.engines.vllm.llm import METHODS, VllmError, require_vllm
    from dspark_bench.lossless import report_to_json
    from dspark_bench.lossless.vllm import run_vllm_battery
    from dspark_bench.target.model import resolve_target

    folder = Path(out) if out else Path(f"results/lossless-vllm-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_folder(folder)
    require_vllm()
    names = [d.strip() for d in (drafter_list or "none,ngram").split(",") if d.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    fixes, llm_opts = lossless_options(engine_opt, "check-lossless --engine vllm")
    exports = with_shipped_exports(RunSpec(target=target, drafters=tuple(names)), folder, say=console.print).drafter_options
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

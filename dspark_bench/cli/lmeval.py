"""``dspark-bench lm-eval``: lm-eval's ``simple_evaluate`` over the ``dspark`` model and our offline tasks.

It calls ``lm_eval.simple_evaluate`` directly (not lm-eval's own CLI), so our task folder is always included,
the model instance stays in hand, and only the options below exist. With ``--output-path OUT`` one folder
``OUT/dspark-<time>/`` holds lm-eval's ``results_<date>.json`` (+ ``samples_<task>_<date>.jsonl`` with
``--log-samples``) next to our ``manifest.json``, ``records.jsonl`` and ``summary.json`` for the same
generations. Attach it to the main group with ``main.add_command(lm_eval_command)``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click

from dspark_bench.cli.common import friendly


def _limit(value: str | None) -> int | float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not number > 0 or math.isinf(number) or (number > 1 and not number.is_integer()):
        raise click.UsageError(f"--limit {value!r}: give a positive count of documents, or a fraction below 1")
    return int(number) if number >= 1 else number


def _gen_kwargs(text: str | None) -> None:
    """Refuse generation kwargs the dspark model does not read (it would fail on them after the model loads)."""
    from lm_eval.utils import simple_parse_args_string

    from dspark_bench.lmeval.model import GEN_KEYS

    unknown = sorted(set(simple_parse_args_string(text or "")) - GEN_KEYS)
    if unknown:
        raise click.UsageError(f"--gen-kwargs {text!r}: the dspark model has no generation argument "
                               f"{', '.join(unknown)}; accepted: {', '.join(sorted(GEN_KEYS))}")


def _check(model_args: str, batch_size: int) -> None:
    """Bad --model-args fail here, before the task index is read and the target loads."""
    from lm_eval.utils import simple_parse_args_string

    from dspark_bench.lmeval.model import check_model_args, parse_model_args

    if batch_size < 1:
        raise click.UsageError(f"--batch-size {batch_size}: give a positive integer")
    given = simple_parse_args_string(model_args)
    if "batch_size" in given or "max_batch_size" in given:
        raise click.UsageError("--model-args: give the batch size with --batch-size (or concurrency=N in "
                               "--model-args), not batch_size")
    check_model_args(*parse_model_args({**given, "batch_size": batch_size}))


def _tasks(text: str, include: tuple[str, ...]):
    """The --tasks names and lm-eval's task manager, after checking that it knows every name."""
    from dspark_bench.lmeval import task_manager, unknown_tasks

    names = [t.strip() for t in text.split(",") if t.strip()]
    manager = task_manager(names, include)
    problem = unknown_tasks(manager, names)
    if problem:
        raise click.UsageError(problem)
    return names, manager


def _model_args(text: str, folder: Path | None) -> str:
    """Put the acceptance records into the run folder unless the user chose a ``records_dir``."""
    if folder is None or "records_dir=" in text:
        return text
    return ",".join(p for p in (text, f"records_dir={folder}") if p)


@click.command(name="lm-eval")
@click.option("--tasks", required=True, help="Comma list: dspark_gsm8k, dspark_humaneval, or any lm-eval task.")
@click.option("--model-args", default="", help="target=...,drafter=...,scheduler=...,temperature=...,"
              "max_gen_toks=...,dtype=...,drafter.OPTION=... (see dspark_bench.lmeval.model).")
@click.option("--batch-size", default=1, show_default=True, type=int, help="Requests decoded together.")
@click.option("--limit", default=None, help="Documents per task (or a fraction of them).")
@click.option("--output-path", default=None, help="Folder for lm-eval's results and our acceptance records.")
@click.option("--include-path", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Extra folder of task YAMLs (repeatable).")
@click.option("--log-samples", is_flag=True, help="Also save every sample (needs --output-path).")
@click.option("--gen-kwargs", default=None, help="Override the tasks' generation_kwargs, e.g. temperature=1.")
@click.option("--confirm-run-unsafe-code", is_flag=True, help="Allow tasks that execute model code (HumanEval).")
@click.option("--seed", default=1234, show_default=True, type=int, help="lm-eval's python/numpy/torch seeds.")
@friendly
def lm_eval_command(tasks, model_args, batch_size, limit, output_path, include_path, log_samples, gen_kwargs,
                    confirm_run_unsafe_code, seed):
    """Evaluate accuracy with lm-eval while decoding through our engine; acceptance stats are recorded too.
    Every option and task name is checked before the target loads."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import handle_non_serializable, make_table

    from dspark_bench.lmeval.model import DSparkLM

    if log_samples and output_path is None:
        raise click.UsageError("--log-samples needs --output-path")
    n_docs = _limit(limit)
    _gen_kwargs(gen_kwargs)
    _check(model_args, batch_size)
    names, manager = _tasks(tasks, include_path)
    folder = Path(output_path) / f"dspark-{time.strftime('%Y%m%d-%H%M%S')}" if output_path else None
    args = _model_args(model_args, folder)
    lm = DSparkLM.create_from_arg_string(args, {"batch_size": batch_size})
    # a ".json" output path makes lm-eval write results_<date>.json and samples_*.jsonl straight into `folder`
    tracker = EvaluationTracker(output_path=str(folder / "results.json")) if folder else None
    try:
        results = lm_eval.simple_evaluate(
            model=lm, model_args=args, tasks=names, limit=n_docs, task_manager=manager,
            log_samples=log_samples, evaluation_tracker=tracker, gen_kwargs=gen_kwargs, batch_size=batch_size,
            confirm_run_unsafe_code=confirm_run_unsafe_code, random_seed=seed, numpy_random_seed=seed,
            torch_random_seed=seed, fewshot_random_seed=seed)
    finally:
        lm.close()
    samples = results.pop("samples", None)
    if tracker is not None:
        tracker.save_results_aggregated(results=results, samples=samples)
        for name in results["configs"] if log_samples else ():
            tracker.save_results_samples(task_name=name, samples=samples[name])
    click.echo(make_table(results))
    acceptance = results["config"]["dspark"]["acceptance"]
    click.echo(json.dumps({"acceptance": acceptance, "records_dir": results["config"]["dspark"]["records_dir"]},
                          indent=2, default=handle_non_serializable))


if __name__ == "__main__":
    lm_eval_command()

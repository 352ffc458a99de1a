"""``dspark-bench lm-eval``: lm-eval's ``simple_evaluate`` over the ``dspark`` model and our offline tasks.

It calls ``lm_eval.simple_evaluate`` directly (not lm-eval's own CLI), so our task folder is always included,
the model instance stays in hand, and only the options below exist. With ``--output-path OUT`` one folder
``OUT/dspark-<time>/`` holds lm-eval's ``results_<date>.json`` (+ ``samples_<task>_<date>.jsonl`` with
``--log-samples``) next to our ``manifest.json``, ``records.jsonl`` and ``summary.json`` for the same
generations. Attach it to the main group with ``main.add_command(lm_eval_command)``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click


def _limit(value: str | None) -> int | float | None:
    if value is None:
        return None
    number = float(value)
    if number <= 0:
        raise click.BadParameter(f"--limit {value!r}: give a positive count, or a fraction below 1")
    return int(number) if number >= 1 else number


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
@click.option("--include-path", multiple=True, help="Extra folder of task YAMLs (repeatable).")
@click.option("--log-samples", is_flag=True, help="Also save every sample (needs --output-path).")
@click.option("--gen-kwargs", default=None, help="Override the tasks' generation_kwargs, e.g. temperature=1.")
@click.option("--confirm-run-unsafe-code", is_flag=True, help="Allow tasks that execute model code (HumanEval).")
@click.option("--seed", default=1234, show_default=True, type=int, help="lm-eval's python/numpy/torch seeds.")
def lm_eval_command(tasks, model_args, batch_size, limit, output_path, include_path, log_samples, gen_kwargs,
                    confirm_run_unsafe_code, seed):
    """Evaluate accuracy with lm-eval while decoding through our engine; acceptance stats are recorded too."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import handle_non_serializable, make_table

    from dspark_bench.lmeval import task_manager
    from dspark_bench.lmeval.model import DSparkLM

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if log_samples and output_path is None:
        raise click.BadParameter("--log-samples needs --output-path")
    folder = Path(output_path) / f"dspark-{time.strftime('%Y%m%d-%H%M%S')}" if output_path else None
    args = _model_args(model_args, folder)
    lm = DSparkLM.create_from_arg_string(args, {"batch_size": batch_size})
    # a ".json" output path makes lm-eval write results_<date>.json and samples_*.jsonl straight into `folder`
    tracker = EvaluationTracker(output_path=str(folder / "results.json")) if folder else None
    try:
        results = lm_eval.simple_evaluate(
            model=lm, model_args=args, tasks=names, limit=_limit(limit), task_manager=task_manager(names, include_path),
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

"""lm-eval integration: the ``dspark`` model (:mod:`.model`) and offline tasks (``tasks/``).

Importing this package is cheap; ``import dspark_bench.lmeval.model`` registers the model with lm-eval::

    import lm_eval
    import dspark_bench.lmeval.model  # noqa: F401  (registers "dspark")
    from dspark_bench.lmeval import task_manager

    lm_eval.simple_evaluate(model="dspark", model_args="target=smollm2-135m,drafter=ngram",
                            tasks=["dspark_gsm8k"], limit=30, task_manager=task_manager(["dspark_gsm8k"]))

``TaskManager(include_path=str(TASKS_DIR))`` works as well; it also indexes lm-eval's ~10k built-in task
files (about 25 s), which :func:`task_manager` skips when every requested task is found without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASKS = ("dspark_gsm8k", "dspark_humaneval")

__all__ = ["TASKS", "TASKS_DIR", "task_manager"]


def task_manager(tasks: Sequence[str] = TASKS, include: Sequence[str | Path] = ()):
    """An lm-eval ``TaskManager`` over our tasks (+ ``include`` folders), with lm-eval's built-in tasks only
    when some requested task is not found otherwise."""
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR), *map(str, include)]
    manager = TaskManager(include_path=paths, include_defaults=False)
    if set(tasks) <= set(manager.all_tasks):
        return manager
    return TaskManager(include_path=paths, include_defaults=True)

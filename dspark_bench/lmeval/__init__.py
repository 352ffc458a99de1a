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

import difflib
from collections.abc import Sequence
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASKS = ("dspark_gsm8k", "dspark_humaneval")

__all__ = ["TASKS", "TASKS_DIR", "task_manager", "unknown_tasks"]


def task_manager(tasks: Sequence[str] = TASKS, include: Sequence[str | Path] = ()):
    """An lm-eval ``TaskManager`` over our tasks (+ ``include`` folders), with lm-eval's built-in tasks only
    when some requested task is not found otherwise."""
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR), *map(str, include)]
    manager = TaskManager(include_path=paths, include_defaults=False)
    if set(tasks) <= set(manager.all_tasks):
        return manager
    return TaskManager(include_path=paths, include_defaults=True)


def unknown_tasks(manager, tasks: Sequence[str]) -> str | None:
    """None when lm-eval's ``manager`` knows every name of ``tasks`` (a task, group or tag, or a task YAML file),
    else one line naming the others, with near names, and what is accepted."""
    if not tasks:
        return "--tasks names no task; accepted: a comma list such as dspark_gsm8k,dspark_humaneval"
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not Path(t).is_file()]
    if not unknown:
        return None
    near = sorted({m for t in unknown for m in difflib.get_close_matches(t, known, n=3)})
    return (f"unknown lm-eval task(s) {', '.join(unknown)}" + (f" (near: {', '.join(near)})" if near else "")
            + f"; accepted: our tasks {', '.join(TASKS)}, any task, group or tag of lm-eval and of --include-path "
            "folders (list them with: lm-eval ls tasks), or a task YAML file")

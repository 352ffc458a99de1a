"""lm-eval hooks of the offline dspark tasks, loaded by the YAMLs next to this file (``!function utils.NAME``).

Documents come from the packaged suites (:func:`dspark_bench.evaluation.suites.load_dataset` with its default cap and
seed), in the suite's order, so ``--limit N`` evaluates exactly the prompts of ``dspark-bench run --limit N``.
Nothing is downloaded and no copy of the data is written.
"""

from __future__ import annotations

from typing import Any

from dspark_bench.evaluation.suites import load_dataset
from dspark_bench.lmeval.humaneval_exec import run_program
from dspark_bench.lmeval.scoring import extract_gsm8k, humaneval_program, same_answer


def _dataset(rows: list[dict]):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def gsm8k_dataset(**_lm_eval_metadata: Any):
    """``custom_dataset`` of dspark_gsm8k (lm-eval passes its task metadata as keywords; they are not used)."""
    return _dataset([{"prompt_id": p.prompt_id, "text": p.text, "answer": p.meta["answer"]}
                     for p in load_dataset("gsm8k")])


def humaneval_dataset(**_lm_eval_metadata: Any):
    """``custom_dataset`` of dspark_humaneval."""
    keys = ("task_id", "prompt", "test", "entry_point")
    return _dataset([{"prompt_id": p.prompt_id, "text": p.text, **{k: p.meta[k] for k in keys}}
                     for p in load_dataset("humaneval")])


def gsm8k_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"exact_match": float(same_answer(extract_gsm8k(results[0]), doc["answer"]))}


def humaneval_results(doc: dict, results: list[str]) -> dict[str, float]:
    program = humaneval_program(results[0], doc["prompt"], doc["test"], doc["entry_point"])
    return {"pass@1": float(run_program(program).passed)}

"""``dspark-bench run --workers N [--ray-address ADDR]``: a run's prompts sharded across N Ray workers.

Sharding is by chunk (``concurrency`` consecutive prompts), chunk c to worker ``c mod N``. Every draw is keyed
by (request seed, position, purpose), so a request's tokens do not depend on the batch it shares, and the sharded
run decodes the same tokens as a single-process one (identical at fp32); only the queue each round saw
(``waiting``) differs, since a shard queues fewer requests. Each worker (a Ray task, one GPU each where there are
GPUs) loads the target and runs :class:`~dspark_bench.engines.native.runner.Run` on its shard into ``OUT/shards/worker-i``; the
driver then writes one run folder: the records of every worker ordered by repeat, chunk and drafter (then
completion), the merged manifest (``workers``, each worker's ``shard`` of prompt ids and its state) and the
summary over all records (:func:`dspark_bench.evaluation.metrics.summarize`). A worker that dies loses only its requests
that had not finished: its records written so far are kept (they are flushed one by one), the manifest lists the
rest under ``unfinished``, and ``dspark-bench run --resume OUT`` decodes them (in one process,
:func:`runner.resume`). Ray does the scheduling, placement and failure detection; nothing here re-implements it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dspark_bench.core.records import ResultsError
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import missing_keys
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import MANIFEST, RECORDS, SUMMARY, read_manifest, read_records, write_json
from dspark_bench.evaluation.suites import Prompt


def shard_chunks(n_prompts: int, concurrency: int, workers: int) -> list[list[int]]:
    """Prompt positions per worker: chunk c (positions c*concurrency ...) goes to worker c mod ``workers``."""
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    out: list[list[int]] = [[] for _ in range(workers)]
    for c, start in enumerate(range(0, n_prompts, concurrency)):
        out[c % workers].extend(range(start, min(start + concurrency, n_prompts)))
    return out


def ordered(records: Sequence[Any], prompts: Sequence[Prompt], concurrency: int, drafters: Sequence[str]) -> list:
    """Records ordered by repeat, chunk and drafter, then as they finished (stable)."""
    pos = {(p.dataset, p.prompt_id): i for i, p in enumerate(prompts)}
    rank = {d: i for i, d in enumerate(drafters)}
    return sorted(records, key=lambda r: (r.repeat, pos[(r.dataset, r.prompt_id)] // concurrency, rank[r.drafter]))


def _decode_shard(spec: RunSpec, keys: list[tuple[str, str]], folder: str, cache_dir: str | None) -> str:
    """One worker: load the suite (prompts travel as (dataset, prompt id): they hold read-only mappings, which do
    not pickle) and the target, run its shard with the ordinary runner, return its folder."""
    from dspark_bench.engines.native.runner import Run
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.target.model import Target

    by_key = {(p.dataset, p.prompt_id): p for p in load_suite(spec.suite, spec.limit, skip=spec.skip)}
    target = Target.load(spec.target, dtype=spec.dtype, cache_dir=Path(cache_dir) if cache_dir else None,
                         forward_path=spec.target_path)
    Run(spec, target, [by_key[k] for k in keys], Path(folder)).execute()
    return folder


def run_on_ray(spec: RunSpec, prompts: Sequence[Prompt], out: Path, workers: int, address: str | None = None,
               cache_dir: Path | None = None, gpus_per_worker: float = 0.0) -> dict:
    """Decode ``prompts`` on ``workers`` Ray tasks and write one run folder at ``out``; returns the summary."""
    import ray

    out = Path(out)
    if (out / RECORDS).exists():
        raise ResultsError(f"{out} already holds a run; choose another --out")
    shards = shard_chunks(len(prompts), spec.concurrency, workers)
    folders = [out / "shards" / f"worker-{i}" for i in range(workers)]
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=1, num_gpus=gpus_per_worker, max_retries=0)(_decode_shard)
    refs = {i: task.remote(spec, [(prompts[j].dataset, prompts[j].prompt_id) for j in shards[i]], str(folders[i]),
                           str(cache_dir) if cache_dir else None)
            for i in range(workers) if shards[i]}
    states = {}
    for i, ref in refs.items():
        try:
            ray.get(ref)
            states[i] = "ok"
        except Exception as exc:  # noqa: BLE001 - a dead worker loses its unfinished requests, not the run
            states[i] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return join_shards(spec, prompts, out, shards, folders, states, address)


def join_shards(spec: RunSpec, prompts: Sequence[Prompt], out: Path, shards: list[list[int]], folders: list[Path],
                states: dict[int, str], address: str | None) -> dict:
    """The one run folder from the workers' folders (module docstring)."""
    records = [r for i, f in enumerate(folders) if shards[i] and (f / RECORDS).is_file() for r in read_records(f)]
    records = ordered(records, prompts, spec.concurrency, spec.drafters)
    unfinished = missing_keys(spec, prompts, records)  # `run --resume OUT` decodes these
    first = next((f for i, f in enumerate(folders) if shards[i] and (f / MANIFEST).is_file()), None)
    if first is None:
        raise ResultsError(f"no worker wrote a manifest under {out / 'shards'}: {states}")
    manifest = {**read_manifest(first),
                "args": dataclasses.asdict(spec),
                "prompts": [{"dataset": p.dataset, "domain": p.domain, "prompt_id": p.prompt_id, "index": p.index}
                            for p in prompts],
                "workers": {"count": len(folders), "ray_address": address or "local",
                            "sharding": "chunk c -> worker c mod N",
                            "shards": [{"worker": i, "folder": str(f), "state": states.get(i, "empty"),
                                        "prompt_ids": [prompts[j].prompt_id for j in shards[i]]}
                                       for i, f in enumerate(folders)]},
                "unfinished": unfinished, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    manifest.pop("truncated", None)  # the first worker's cut prompts: every worker's are listed instead
    cut = [t for i, f in enumerate(folders) if shards[i] and (f / MANIFEST).is_file()
           for t in read_manifest(f).get("truncated", [])]
    if cut:
        manifest["truncated"] = cut
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MANIFEST, manifest)
    (out / RECORDS).write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in records), encoding="utf-8")
    summary = summarize(records, spec.block_size)
    write_json(out / SUMMARY, summary)
    return summary

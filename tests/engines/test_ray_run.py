"""``run --workers N``: chunk sharding and ordering (pure), and 2 local Ray workers against one process (the
latter skipped, saying why, where Ray is not installed; ``make vllm-test`` venvs have it via the [ray] extra)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dspark_bench.engines.native.ray import ordered, shard_chunks

ROOT = Path(__file__).resolve().parents[2]
TIMED = {"timings", "ttft_s", "decode_s"}
QUEUE = {"waiting"}  # requests still queued at each round: a shard queues fewer than the whole run


def test_chunks_go_round_robin_and_cover_every_prompt_once():
    assert shard_chunks(7, 2, 2) == [[0, 1, 4, 5], [2, 3, 6]]
    assert shard_chunks(3, 4, 2) == [[0, 1, 2], []]
    assert sorted(i for s in shard_chunks(11, 3, 3) for i in s) == list(range(11))
    with pytest.raises(ValueError, match="--workers"):
        shard_chunks(3, 1, 0)


def test_records_come_back_in_single_process_order():
    prompts = [SimpleNamespace(dataset="d", prompt_id=str(i)) for i in range(4)]
    rec = lambda p, d, k=0: SimpleNamespace(dataset="d", prompt_id=p, drafter=d, repeat=k)  # noqa: E731
    shuffled = [rec("2", "none"), rec("3", "ngram"), rec("1", "none"), rec("0", "ngram"), rec("0", "none"),
                rec("3", "none"), rec("2", "ngram"), rec("1", "ngram")]
    got = [(r.prompt_id, r.drafter) for r in ordered(shuffled, prompts, 2, ["none", "ngram"])]
    assert got == [("1", "none"), ("0", "none"), ("0", "ngram"), ("1", "ngram"),  # chunk 0, finish order kept
                   ("2", "none"), ("3", "none"), ("3", "ngram"), ("2", "ngram")]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dspark_bench.cli.main", "run", *args], env=env, capture_output=True,
                          text=True, cwd=ROOT, timeout=1800)


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed in this venv "
                                                                    "(pip install -e .[ray])")
def test_two_ray_workers_write_the_single_process_run(tmp_path):
    common = ["--drafter", "none,ngram", "--suite", "gsm8k", "--limit", "3", "--max-new-tokens", "12",
              "--dtype", "fp32", "--concurrency", "1"]
    one, two = _cli(*common, "--out", str(tmp_path / "one")), _cli(*common, "--workers", "2", "--out",
                                                                   str(tmp_path / "two"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    rows = {n: {(r["drafter"], r["dataset"], r["prompt_id"], r["repeat"]): r
                for r in map(json.loads, (tmp_path / n / "records.jsonl").read_text().splitlines())}
            for n in ("one", "two")}
    assert sorted(rows["one"]) == sorted(rows["two"]) and len(rows["one"]) == 6
    for key, a in rows["one"].items():
        b = rows["two"][key]
        diff = sorted(k for k in a if k not in TIMED | QUEUE and a[k] != b[k])  # tokens, rounds, batches
        assert diff == [], (key, diff, {k: (a[k], b[k]) for k in diff})
    manifest = json.loads((tmp_path / "two" / "manifest.json").read_text())
    shards = manifest["workers"]["shards"]
    assert [s["state"] for s in shards] == ["ok", "ok"] and manifest["unfinished"] == []
    assert sorted(p for s in shards for p in s["prompt_ids"]) == sorted(p["prompt_id"] for p in manifest["prompts"])
    summaries = [json.loads((tmp_path / n / "summary.json").read_text()) for n in ("one", "two")]
    timed_or_queued = ("ttft_s", "tpot_s", "sequential_share", "overhead_share", "markov_head_share", "sample_share",
                       "mean_batch_queued", "occupancy")  # shares of wall time; rounds while requests were queued
    groups = [{(g["drafter"], g["scope"], g.get("name")): {k: v for k, v in g.items() if "tokens_per_s" not in k
                                                           and "speedup" not in k and k not in timed_or_queued}
               for g in s["groups"]} for s in summaries]
    assert sorted(groups[0]) == sorted(groups[1])
    for key, a in groups[0].items():
        diff = sorted(k for k in a if a[k] != groups[1][key].get(k))
        assert diff == [], (key, diff)


def test_the_joined_manifest_lists_the_prompts_every_worker_cut(tmp_path):
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.native.ray import join_shards
    from dspark_bench.evaluation.suites import Prompt

    prompts = [Prompt("d", "custom", f"p{i}", i, "text") for i in range(3)]
    folders = [tmp_path / "shards" / f"worker-{i}" for i in range(2)]
    cuts = [[{"dataset": "d", "prompt_id": "p0", "prompt_tokens": 90, "kept_tokens": 60}],
            [{"dataset": "d", "prompt_id": "p2", "prompt_tokens": 70, "kept_tokens": 60}]]
    for folder, cut in zip(folders, cuts, strict=True):
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"schema_version": 1, "truncated": cut}))
        (folder / "records.jsonl").write_text("")
    spec = RunSpec(drafters=("none",), truncate="left")
    join_shards(spec, prompts, tmp_path, [[0, 1], [2]], folders, {0: "ok", 1: "ok"}, None)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["truncated"] == cuts[0] + cuts[1] and manifest["args"]["truncate"] == "left"

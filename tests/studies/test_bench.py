"""The engine benchmark and its GPU script run end to end at tiny settings (no timing is asserted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import random_prompts, tiny_target

from dspark_bench.core.rounds import Request
from dspark_bench.studies.bench import BenchSpec, run_bench

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


def test_bench_reports_every_share_and_ratio():
    target = tiny_target("llama")
    reqs = [Request(i, tuple(p), 40 + i) for i, p in enumerate(random_prompts(6, seed=3))]
    spec = BenchSpec(max_new_tokens=8, repeats=1, concurrency=(1, 4), drafters=("none", "ngram", "dspark"),
                     hf_batch=4)
    out = run_bench(target, reqs, spec)
    assert set(out["overhead"]) == {"1", "4"}
    for conc, per in out["overhead"].items():
        assert set(per) == {"none", "ngram", "dspark"}
        for name, v in per.items():
            m = v["median"]
            assert m["errors"] == 0
            assert 0.0 < m["overhead_share"] < 1.0 and 0.0 <= m["sample_share"] < 1.0
            assert (m["markov_head_share"] > 0) == (name == "dspark")
            assert m["system_tokens_per_s"] > 0 and m["per_request_tokens_per_s"] > 0
            assert m["occupancy"] == pytest.approx(1.0)  # the batch is held at R while requests are queued
            assert m["system_tokens_per_s"] >= m["per_request_tokens_per_s"] * (0.99 if conc == "1" else 1.0)
    for batch in ("1", "4"):
        v = out["vs_hf"][batch]
        assert v["batch"] == int(batch) and v["ours_over_hf"]["median"] > 0
        assert all(r[m]["tokens"] > 0 for r in v["repeats"] for m in ("ours:none", "hf:generate"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_engine_script_runs_on_cpu_at_tiny_settings(tmp_path):
    """recipes/gpu_engine.sh's bench stage in its CPU smoke mode: the real embedded target, the real CLI, every
    measurement (its vllm stage: tests/studies/test_bench_vllm.py, in vLLM's venv)."""
    from dspark_bench.target.model import default_cache_dir

    if not (default_cache_dir() / "smollm2-135m-instruct" / "model.safetensors").exists():
        pytest.skip("the embedded target's converted checkpoint is not in the cache (run any smollm2 command once)")
    env = {**os.environ, "BIN": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_engine.sh"), str(tmp_path / "out"), "smoke", "bench"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json

    result = json.loads((tmp_path / "out" / "bench" / "bench.json").read_text())
    assert set(result["overhead"]) == {"1", "2"} and set(result["vs_hf"]) == {"1", "2"}
    assert result["overhead"]["2"]["dspark"]["median"]["markov_head_share"] > 0
    target = result["target"]  # the forward that ran, as in run manifests
    assert target["forward_path"] == "fast" and target["attention_kernel"] in ("cpu-decode-kernel", "sdpa")
    env = result["environment"]  # the checkout and load as the measurement started, and the load as it ended
    assert env["started"] <= env["finished"] and "sha" in env["git"]
    assert env["load_before_1_5_15"] == env["machine"]["load_average_1_5_15"] and "load_after_1_5_15" in env

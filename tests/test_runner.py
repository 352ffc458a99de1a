"""The runner: continuous batching over all prompts, drafters interleaved round by round, occupancy in the
summary."""

from __future__ import annotations

import pytest
from conftest import tiny_target

from dspark_bench.results import read_records
from dspark_bench.runner import Run, RunSpec
from dspark_bench.suites import Prompt

pytestmark = pytest.mark.usefixtures("one_thread")


def test_run_holds_its_concurrency_and_interleaves_drafters(tmp_path, monkeypatch):
    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} {'xyz' * (i % 3)}") for i in range(9)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=12, concurrency=3, warmup=False)
    summary = Run(spec, target, prompts, tmp_path / "run").execute()
    records = read_records(tmp_path / "run")
    assert len(records) == 18 and all(r.ok for r in records)
    # every round during which requests were still queued ran at the full batch, for both drafters
    for rec in records:
        assert all(b == 3 for b, w in zip(rec.batch, rec.waiting, strict=True) if w > 0)
    groups = {g["drafter"]: g for g in summary["groups"] if g["scope"] == "all"}
    for name in ("none", "ngram"):
        g = groups[name]
        assert g["occupancy"] >= 0.95 and g["mean_batch_queued"] == pytest.approx(3.0)
        assert g["mean_batch"] <= 3.0 and 0.0 < g["overhead_share"] < 1.0
        assert g["system_tokens_per_s"] > 0 and g["tokens_per_s"] > 0
    # side by side: the two drafters' results arrive interleaved, not one drafter's whole queue first
    order = [r.drafter for r in records]
    assert order[: len(order) // 2].count("ngram") >= 2 and order[len(order) // 2 :].count("none") >= 2


def test_gate_and_metrics_import_no_model_code():
    """The round's data types live in dspark_bench.rounds: results, metrics and gate import no engine, no
    drafter, no transformers and not even torch (no import cycle through the engine)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, dspark_bench.gate, dspark_bench.metrics, dspark_bench.results; "
            "print(sorted(m for m in sys.modules if m.startswith(('dspark_bench.', 'transformers', 'torch'))))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(root), "PATH": ""}).stdout
    loaded = ast.literal_eval(out)  # the printed list of module names
    assert loaded == ["dspark_bench.allocator", "dspark_bench.gate", "dspark_bench.metrics", "dspark_bench.results",
                      "dspark_bench.rounds"]  # allocator: ctypes only (the manifest records the host allocator)

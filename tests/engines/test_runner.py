"""The runner: continuous batching over all prompts, drafters interleaved round by round, occupancy in the
summary."""

from __future__ import annotations

import pytest
from conftest import tiny_target

from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation.runs import read_records
from dspark_bench.evaluation.suites import Prompt

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
    """The round's data types live in dspark_bench.core (rounds, records): run folders, metrics and gate import no
    engine, no drafter, no transformers and not even torch (no import cycle through the engine)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, dspark_bench.evaluation.gate, dspark_bench.evaluation.metrics, dspark_bench.evaluation.runs; "
            "print(sorted(m for m in sys.modules if m.startswith(('dspark_bench.', 'transformers', 'torch'))))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(root), "PATH": ""}).stdout
    loaded = ast.literal_eval(out)  # the printed list of module names
    assert loaded == ["dspark_bench.core", "dspark_bench.core.records", "dspark_bench.core.rounds",
                      "dspark_bench.evaluation", "dspark_bench.evaluation.gate", "dspark_bench.evaluation.metrics",
                      "dspark_bench.evaluation.runs", "dspark_bench.target",
                      "dspark_bench.target.allocator"]  # allocator: ctypes only (the manifest records the host allocator)


def test_the_warmup_teaches_the_runs_scheduler_nothing_but_keeps_its_measured_profile(tmp_path, monkeypatch):
    """The warmup's rounds are cold and unrecorded: an adapting scheduler must not learn from them (its decisions
    then follow from the recorded rounds alone, which `dspark-bench study sched-replay` relies on). A profile the
    scheduler measured on first use is kept, so the timed rounds do not pay for measuring it again."""
    from dspark_bench.engines.native.runner import build_requests

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    prompts = [Prompt("ds", "custom", "p0", 0, "a prompt to warm up with")]
    spec = RunSpec(target="tiny", drafters=("ngram",), scheduler="hardware-aware", max_new_tokens=12)
    run = Run(spec, target, prompts, tmp_path / "run")
    engine = run._engine("ngram")
    run._warmup({"ngram": engine}, build_requests(target, prompts, spec.seed))
    sched = engine.scheduler
    assert sched._clock == 0 and not sched._factors and sched.kappa() == 1.0  # it saw no round
    assert sched._table is not None  # the profile the warmup's copy measured

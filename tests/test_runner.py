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


def test_the_warmup_teaches_the_runs_scheduler_nothing_but_keeps_its_measured_profile(tmp_path, monkeypatch):
    """The warmup's rounds are cold and unrecorded: an adapting scheduler must not learn from them (its decisions
    then follow from the recorded rounds alone, which scripts/sched_replay.py relies on). A profile the
    scheduler measured on first use is kept, so the timed rounds do not pay for measuring it again."""
    from dspark_bench.runner import build_requests

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


def test_the_replay_orders_rounds_that_share_no_request_by_what_was_still_queued():
    """At one request, or wherever every request of a batch ends in the same round, two stretches of rounds share
    no request, and nothing in their timings orders them. Session 18's replay put such stretches out of order (its
    R = 1 and R = 2 cells seemed to diverge from the engine in up to 116 of 424 rounds); the requests still queued
    at each round order them, since the queue only shrinks."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    root = Path(__file__).resolve().parents[1]
    loader = importlib.util.spec_from_file_location("sched_replay", root / "scripts" / "sched_replay.py")
    replay = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(replay)

    def record(dataset: str, prompt_id: str, index: int, waiting: int, first: float) -> SimpleNamespace:
        timings = [(first + k, 0.1, 0.01) for k in range(3)]  # three rounds, each its own timing row
        return SimpleNamespace(dataset=dataset, prompt_id=prompt_id, index=index, prompt_len=5,
                               rounds=[(7, 7, 1, 2)] * 3, timings=timings, waiting=(waiting,) * 3)

    queue = [("math", "q7"), ("code", "q0"), ("chat", "q3")]  # the run's queue: neither alphabetical nor by index
    records = [record("chat", "q3", 3, 0, 30.0), record("code", "q0", 0, 1, 20.0), record("math", "q7", 7, 2, 10.0)]
    for known in (queue, None):
        order = [(m[0].prompt_id, m[1]) for members in replay.ordered_rounds(records, known) for m in members]
        assert order == [(p, i) for p in ("q7", "q0", "q3") for i in range(3)]


def test_a_hardware_aware_run_replays_from_its_records_decision_for_decision(tmp_path, monkeypatch):
    """scripts/sched_replay.py feeds a new scheduler what the engine gave the run's (slots, the last round's
    timing, proposals with their confidences, verified and accepted counts), all from the records: it plans what
    the run planned in every round of both repeats (the warmup's rounds teach the run's scheduler nothing). A
    scheduler that read anything the records do not hold (a clock, a round's tokens) would diverge."""
    import importlib.util
    from pathlib import Path

    from dspark_bench.profile import measure_profile, save_profile
    from dspark_bench.results import read_manifest
    from dspark_bench.schedulers import create_scheduler

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    save_profile(measure_profile(target, (1, 2, 4, 8, 16, 32), (64,), repeats=1), tmp_path / "profile.json")
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} {'abab' * (i % 4)}") for i in range(8)]
    spec = RunSpec(target="tiny", drafters=("dspark",), scheduler="hardware-aware", max_new_tokens=24,
                   concurrency=3, repeats=2, profile=str(tmp_path / "profile.json"))  # (random weights)
    Run(spec, target, prompts, tmp_path / "run").execute()
    records = read_records(tmp_path / "run")
    root = Path(__file__).resolve().parents[1]
    loader = importlib.util.spec_from_file_location("sched_replay", root / "scripts" / "sched_replay.py")
    replay = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(replay)
    calibration = read_manifest(tmp_path / "run")["drafters"]["dspark"]["scheduler_options"].get("calibration")
    sched = create_scheduler("hardware-aware", profile=str(tmp_path / "profile.json"), calibration=calibration)
    rows = [row for k in (0, 1) for row in replay.replay([r for r in records if r.repeat == k], sched)]
    assert {row["recorded"] for row in rows} == {True, False}  # it drafted some rounds and skipped others
    assert [row["planned"] for row in rows] == [row["recorded"] for row in rows]

"""dspark_bench.studies.sched_replay and ``dspark-bench study sched-replay``: a recorded hardware-aware cell's inputs fed
to a new scheduler, round by round, from the records alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import tiny_target

from dspark_bench.cli.study import sched_replay
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation.runs import read_manifest, read_records
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.studies.sched_replay import ordered_rounds, replay

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_replay_orders_rounds_that_share_no_request_by_what_was_still_queued():
    """At one request, or wherever every request of a batch ends in the same round, two stretches of rounds share
    no request, and nothing in their timings orders them (ordered by index alone, the replay of a sweep's R = 1
    and R = 2 cells seemed to diverge from the engine in up to 116 of 424 rounds); the requests still queued at
    each round order them, since the queue only shrinks."""

    def record(dataset: str, prompt_id: str, index: int, waiting: int, first: float) -> SimpleNamespace:
        timings = [(first + k, 0.1, 0.01) for k in range(3)]  # three rounds, each its own timing row
        return SimpleNamespace(dataset=dataset, prompt_id=prompt_id, index=index, prompt_len=5,
                               rounds=[(7, 7, 1, 2)] * 3, timings=timings, waiting=(waiting,) * 3)

    queue = [("math", "q7"), ("code", "q0"), ("chat", "q3")]  # the run's queue: neither alphabetical nor by index
    records = [record("chat", "q3", 3, 0, 30.0), record("code", "q0", 0, 1, 20.0), record("math", "q7", 7, 2, 10.0)]
    for known in (queue, None):
        order = [(m[0].prompt_id, m[1]) for members in ordered_rounds(records, known) for m in members]
        assert order == [(p, i) for p in ("q7", "q0", "q3") for i in range(3)]


def test_a_hardware_aware_run_replays_from_its_records_decision_for_decision(tmp_path, monkeypatch):
    """The replay feeds a new scheduler what the engine gave the run's (slots, the last round's timing, proposals
    with their confidences, verified and accepted counts), all from the records: it plans what the run planned in
    every round of both repeats (the warmup's rounds teach the run's scheduler nothing). A scheduler that read
    anything the records do not hold (a clock, a round's tokens) would diverge. The command says so in its last
    line."""
    from dspark_bench.scheduling.profile import measure_profile, save_profile
    from dspark_bench.scheduling.schedulers import create_scheduler

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    save_profile(measure_profile(target, (1, 2, 4, 8, 16, 32), (64,), repeats=1), tmp_path / "profile.json")
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} {'abab' * (i % 4)}") for i in range(8)]
    spec = RunSpec(target="tiny", drafters=("dspark",), scheduler="hardware-aware", max_new_tokens=24,
                   concurrency=3, repeats=2, profile=str(tmp_path / "profile.json"))  # (random weights)
    Run(spec, target, prompts, tmp_path / "run").execute()
    records = read_records(tmp_path / "run")
    calibration = read_manifest(tmp_path / "run")["drafters"]["dspark"]["scheduler_options"].get("calibration")
    sched = create_scheduler("hardware-aware", profile=str(tmp_path / "profile.json"), calibration=calibration)
    rows = [row for k in (0, 1) for row in replay([r for r in records if r.repeat == k], sched)]
    assert {row["recorded"] for row in rows} == {True, False}  # it drafted some rounds and skipped others
    assert [row["planned"] for row in rows] == [row["recorded"] for row in rows]
    args = [str(tmp_path / "run"), "--profile", str(tmp_path / "profile.json"), "--repeats", "0,1",
            "--layout", sched.layout, *(["--calibration", calibration] if calibration else [])]
    done = CliRunner().invoke(sched_replay, args)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert len(lines) == len(rows) + 1 and lines[-1] == f"decisions that agree: {len(rows)} of {len(rows)}"
    assert lines[0].startswith("r0    0 R=") and any(line.startswith("r1 ") for line in lines)
    bad = CliRunner().invoke(sched_replay, [*args[:3], "--repeats", "zero"])
    assert bad.exit_code == 2 and "--repeats" in bad.output

"""Open-loop load on our engine: admission by arrival, queueing, deliveries, and outputs equal to closed loop."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.core.arrivals import Arrivals
from dspark_bench.core.records import record_from_result
from dspark_bench.core.timing import StepClock
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.engines.native.runner import Run, check_open_loop
from dspark_bench.evaluation.runs import read_manifest, read_records
from dspark_bench.evaluation.suites import Prompt

pytestmark = pytest.mark.usefixtures("one_thread")
FAR = 1000.0  # an arrival long after every other request has finished


def _requests(arrivals, seed=0):
    return [Request(i, tuple(p), 100 + i, "synthetic", "custom", f"p{i}", arrival_s=t)
            for i, (p, t) in enumerate(zip(random_prompts(len(arrivals), seed=seed), arrivals, strict=True))]


def _decode(target, name, reqs, **cfg):
    results = []
    RoundLoop(target, drafters.create(name, target), EngineConfig(**cfg)).run(reqs, results.append)
    return {r.request.request_id: r for r in results}


def test_the_step_clock_runs_only_during_steps_and_jumps_to_an_arrival():
    now = [0.0]
    clock = StepClock(source=lambda: now[0])
    with clock.running():
        now[0] += 2.0
        assert clock.now() == 2.0
    now[0] += 50.0  # another engine's step: not this session's time
    assert clock.now() == 2.0
    clock.wait_until(10.0)
    assert clock.now() == 10.0
    clock.wait_until(3.0)  # already past: no-op
    with clock.running():
        now[0] += 1.0
    assert clock.now() == 11.0


def test_requests_arriving_later_are_admitted_later(tiny):
    out = _decode(tiny, "ngram", _requests([0.0, 0.0, FAR, FAR + 1.0]), max_new_tokens=16, concurrency=4)
    early, late = [out[0], out[1]], [out[2], out[3]]
    first_done = max(r.served.delivered_s[-1] for r in early)
    assert first_done < FAR
    for r in late:
        # nothing was in flight: the session waited for the arrival, admitting it at once (no queue)
        assert r.served.admitted_s >= r.served.arrival_s >= FAR and r.served.admitted_s - r.served.arrival_s < 1.0
        assert all(x.waiting == 0 for x in r.rounds)
    for r in early:  # the two late requests had not arrived while the early ones ran: nobody was waiting
        assert r.served.admitted_s < 1.0 and all(x.waiting == 0 for x in r.rounds)
        assert max(x.batch for x in r.rounds) == 2


def test_a_full_batch_queues_the_next_arrival(tiny):
    out = _decode(tiny, "none", _requests([0.0, 0.0, 0.0]), max_new_tokens=10, concurrency=1)
    ends = [out[i].served.delivered_s[-1] for i in range(3)]
    for i in (1, 2):
        rec = record_from_result(out[i], "none", "fixed", i, 0, 1)
        assert out[i].served.admitted_s >= ends[i - 1]  # admitted once the one before it left
        assert rec.queue_s > 0 and rec.queue_s == pytest.approx(out[i].served.admitted_s)
    assert out[0].rounds[0].waiting == 2  # both others had arrived and waited for the slot


def test_records_hold_arrival_queue_itl_and_e2el(tiny):
    out = _decode(tiny, "ngram", _requests([0.0, 0.5]), max_new_tokens=20, concurrency=2, block_size=4)
    for i, res in out.items():
        rec = record_from_result(res, "ngram", "fixed", i, 0, 2)
        assert rec.arrival_s == [0.0, 0.5][i]
        # one delivery for the admission, then one per round (each commits at least one token)
        assert len(rec.itl_s) == len(rec.rounds) and all(g > 0 for g in rec.itl_s)
        assert rec.e2el_s == pytest.approx(res.served.delivered_s[-1] - rec.arrival_s)
        assert rec.e2el_s == pytest.approx(rec.queue_s + (res.served.delivered_s[0] - res.served.admitted_s)
                                           + sum(rec.itl_s))


@pytest.mark.parametrize("name, temperature", [("none", 1.0), ("ngram", 1.0), ("ngram", 0.0)])
def test_open_loop_outputs_equal_closed_loop_outputs(tiny, name, temperature):
    arrivals = Arrivals(50.0, seed=3).times(5)
    opened = _decode(tiny, name, _requests(arrivals), max_new_tokens=24, temperature=temperature, concurrency=2)
    closed = _decode(tiny, name, [dataclasses.replace(r, arrival_s=None) for r in _requests(arrivals)],
                     max_new_tokens=24, temperature=temperature, concurrency=3)
    assert {i: r.output_ids for i, r in opened.items()} == {i: r.output_ids for i, r in closed.items()}
    assert all(r.served is None for r in closed.values()) and all(r.served for r in opened.values())


def test_mixed_or_unordered_arrivals_are_refused(tiny):
    for arrivals in ([0.0, None], [1.0, 0.5]):
        with pytest.raises(ValueError, match="arrival order"):
            _decode(tiny, "none", _requests(arrivals), max_new_tokens=4)


def _run_spec(**load):
    return RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=10, warmup=False, seed=11, **load)


def test_a_run_gives_every_drafter_the_same_schedule_and_a_serving_block(tmp_path, monkeypatch):
    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} {'xyz' * (i % 3)}") for i in range(5)]
    spec = _run_spec(request_rate=20.0, max_concurrency=2, slo={"tpot": 10_000.0})
    summary = Run(spec, target, prompts, tmp_path / "run").execute()
    records = read_records(tmp_path / "run")
    want = Arrivals(20.0, 1.0, 11).times(5)
    for name in ("none", "ngram"):
        mine = sorted((r for r in records if r.drafter == name), key=lambda r: r.index)
        assert [r.arrival_s for r in mine] == list(want) and all(r.concurrency == 2 for r in mine)
        assert max(b for r in mine for b in r.batch) <= 2
        block = summary["serving"][name]
        assert block["completed"] == 5 and block["good_requests"] == 5 and block["output_throughput"] > 0
    assert read_manifest(tmp_path / "run")["engine"]["arrivals"] == Arrivals(20.0, 1.0, 11).to_json()
    closed = Run(_run_spec(concurrency=2), target, prompts, tmp_path / "closed").execute()
    assert "serving" not in closed and read_manifest(tmp_path / "closed")["engine"]["arrivals"] == {"closed_loop": 2}
    assert ({(r.drafter, r.index): r.output_ids for r in read_records(tmp_path / "closed")}
            == {(r.drafter, r.index): r.output_ids for r in records})


@pytest.mark.parametrize("load, says", [({"repeats": 2}, "--repeats"), ({"concurrency": 4}, "--max-concurrency")])
def test_what_open_loop_load_does_not_combine_with_is_refused(load, says):
    with pytest.raises(ValueError, match=says):
        check_open_loop(_run_spec(request_rate=math.inf, **load))
    check_open_loop(_run_spec(**load))  # closed loop: accepted


@pytest.mark.parametrize("args, says", [(["--repeats", "2"], "--repeats"), (["--concurrency", "4"], "--max-concurrency"),
                                        (["--workers", "2"], "--workers")])
def test_the_cli_refuses_open_loop_combinations_before_loading(args, says, tmp_path):
    from click.testing import CliRunner

    from dspark_bench.cli.main import main

    res = CliRunner().invoke(main, ["run", "--drafter", "none", "--request-rate", "2", "--out", str(tmp_path / "r"),
                                    *args])
    assert res.exit_code == 2 and says in res.output and not (tmp_path / "r").exists()


@pytest.mark.integration
def test_an_open_loop_cli_run_on_the_embedded_target(tmp_path):
    import json

    from click.testing import CliRunner

    from dspark_bench.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--drafter", "none", "--suite", "gsm8k", "--limit", "2",
                                    "--max-new-tokens", "8", "--request-rate", "4", "--slo", "tpot=60000",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    records = sorted(read_records(out), key=lambda r: r.index)
    assert [r.arrival_s for r in records] == list(Arrivals(4.0, 1.0, 980406).times(2))
    assert all(r.ok and len(r.itl_s) == len(r.rounds) and r.e2el_s > 0 for r in records)
    serving = json.loads((out / "summary.json").read_text())["serving"]["none"]
    assert serving["completed"] == 2 and serving["good_requests"] == 2 and serving["p90_tpot_ms"] > 0

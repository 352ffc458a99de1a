"""``bench --against vllm``: the numbers, ratios, spreads and goals from fake records, and the measurement's order
and warm-ups with the tiny target against a fake vLLM arm (no vLLM needed, no timing asserted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import random_prompts, tiny_target

from dspark_bench.core.records import RequestRecord
from dspark_bench.core.rounds import Request
from dspark_bench.engines.vllm.llm import vllm_version
from dspark_bench.studies.bench import BenchSpec
from dspark_bench.studies.bench_vllm import (
    GOALS,
    Goal,
    busy_ticks,
    call_numbers,
    compare,
    goals,
    markdown,
    ratios,
    run_against_vllm,
    settle,
    spread,
    vllm_requests_of,
)

ROOT = Path(__file__).resolve().parents[2]


def _rec(n_out: int, decode_s: float, ttft_s: float, status: str = "ok", drafter: str = "none") -> RequestRecord:
    return RequestRecord(drafter, "fixed", "ds", "math", "p0", 0, 0, 1, 1, status, "length", 5, (7,) * n_out,
                         ((0, 0, 0, 1),) * max(n_out - 1, 0), (), ttft_s, decode_s)


def _numbers(per_request: float, system: float, ttft: float) -> dict:
    return {"per_request_tokens_per_s": per_request, "system_tokens_per_s": system, "ttft_p50_s": ttft,
            "overhead_share": None}


def test_call_numbers_pool_decode_tokens_and_count_every_output_token_over_the_wall():
    recs = [_rec(11, 1.0, 0.1), _rec(21, 3.0, 0.3), _rec(5, 1.0, 0.2), _rec(0, 0.0, 0.0, status="error")]
    got = call_numbers(recs, wall_s=4.0)
    assert got["per_request_tokens_per_s"] == pytest.approx((10 + 20 + 4) / 5.0)
    assert got["system_tokens_per_s"] == pytest.approx(37 / 4.0)  # first tokens (prefill's) included
    assert got["ttft_p50_s"] == pytest.approx(0.2)
    assert (got["requests"], got["errors"], got["output_tokens"]) == (3, 1, 37)
    assert got["overhead_share"] is None  # vLLM's records carry no round timings
    empty = call_numbers([_rec(0, 0.0, 0.0, status="error")], wall_s=0.0)
    assert empty["system_tokens_per_s"] is None and empty["ttft_p50_s"] is None


def test_ratios_are_ours_over_vllm_and_missing_where_either_is():
    ours, vllm = _numbers(20.0, 30.0, 0.1), _numbers(10.0, 60.0, 0.2)
    assert ratios(ours, vllm) == pytest.approx({"per_request_tokens_per_s": 2.0, "system_tokens_per_s": 0.5,
                                                "ttft_p50_s": 0.5})
    assert ratios({**ours, "system_tokens_per_s": None}, vllm)["system_tokens_per_s"] is None
    assert ratios(ours, {**vllm, "ttft_p50_s": 0.0})["ttft_p50_s"] is None


def test_compare_spreads_each_arm_and_each_ratio_over_repeats():
    reps = [{"ours": _numbers(10.0, 40.0, 0.1), "vllm": _numbers(10.0, 40.0, 0.1)},
            {"ours": _numbers(12.0, 44.0, 0.1), "vllm": _numbers(10.0, 40.0, 0.2)},
            {"ours": _numbers(9.0, 30.0, 0.3), "vllm": _numbers(10.0, 40.0, 0.1)}]
    got = compare(reps)
    assert got["ours"]["per_request_tokens_per_s"] == {"median": 10.0, "min": 9.0, "max": 12.0}
    assert got["ratio"]["per_request_tokens_per_s"]["per_repeat"] == pytest.approx([1.0, 1.2, 0.9])
    assert got["ratio"]["system_tokens_per_s"]["median"] == pytest.approx(1.0)
    assert got["ratio"]["ttft_p50_s"]["min"] == pytest.approx(0.5) and got["ratio"]["ttft_p50_s"]["max"] == pytest.approx(3.0)
    assert [r["ratio"]["system_tokens_per_s"] for r in got["repeats"]] == pytest.approx([1.0, 1.1, 0.75])
    assert spread([None, None]) == {"median": None, "min": None, "max": None}


def test_goals_read_the_median_ratio_at_their_levels_and_say_whether_every_repeat_met_them():
    good = {"ours": _numbers(11.0, 50.0, 0.1), "vllm": _numbers(10.0, 40.0, 0.2)}
    bad = {"ours": _numbers(9.0, 30.0, 0.3), "vllm": _numbers(10.0, 40.0, 0.2)}
    levels = {"1": compare([good, good, bad]), "8": compare([bad, bad, good])}
    got = {(g["metric"], g["concurrency"]): g for g in goals(levels)}
    assert set(got) == {("per_request_tokens_per_s", 1), ("ttft_p50_s", 1), ("system_tokens_per_s", 8),
                        ("ttft_p50_s", 8)}  # per request at 1 only, system at 8 and 32, TTFT everywhere
    assert got["per_request_tokens_per_s", 1]["met"] and not got["per_request_tokens_per_s", 1]["every_repeat"]
    assert got["ttft_p50_s", 1]["met"] and got["ttft_p50_s", 1]["goal"] == "<= 1.0"
    assert got["system_tokens_per_s", 8]["met"] is False and got["ttft_p50_s", 8]["met"] is False
    assert Goal("x", (), True).met(None) is None and GOALS[2].applies(64)


def _fake_records(requests, n_out: int, concurrency: int, repeat: int) -> list[RequestRecord]:
    return [RequestRecord("none", "fixed", r.dataset, r.domain, r.prompt_id, r.index, repeat, r.seed, concurrency,
                          "ok", "length", len(r.prompt_ids), (7,) * n_out, ((0, 0, 0, 1),) * (n_out - 1), (), 0.01,
                          0.1) for r in requests]


class _FakeVllm:
    """vLLM's arm as the measurement sees it: each generate call takes 0.5 s of its clock."""

    def __init__(self, concurrency: int, calls: list):
        self.concurrency, self.calls, self.wall_s, self.closed = concurrency, calls, 0.0, False

    def run(self, group, sampling, max_new_tokens, repeat, concurrency):
        self.calls.append(("vllm", concurrency, repeat, len(group), max_new_tokens))
        self.wall_s += 0.5
        return _fake_records(group, max_new_tokens, concurrency, repeat)

    def close(self):
        self.closed = True


@pytest.mark.usefixtures("one_thread")
def test_the_measurement_interleaves_arms_warms_both_and_keeps_one_vllm_engine_per_level():
    target = tiny_target("llama")
    reqs = [Request(i, tuple(p), 40 + i, "ds", "math", f"p{i}") for i, p in enumerate(random_prompts(3, seed=3))]
    spec = BenchSpec(max_new_tokens=6, repeats=3, concurrency=(1, 2), drafters=("none",), hf=False, hf_batch=0)
    calls, engines = [], []

    def open_vllm(conc):
        engines.append(_FakeVllm(conc, calls))
        return engines[-1]

    waits = []

    def wait():
        waits.append(len(calls))  # the timed calls made so far
        return 0.25

    out = run_against_vllm(target, reqs, spec, open_vllm, wait=wait)
    assert [e.concurrency for e in engines] == [1, 2] and all(e.closed for e in engines)
    assert len(waits) == 2 * 3 * 2  # before every timed call (2 arms x 3 repeats x 2 levels), never a warm-up
    assert [c[2:] for c in calls if c[1] == 2] == [(-1, 2, 6), (0, 3, 6), (1, 3, 6), (2, 3, 6)]  # warm-up first
    for level in out["levels"].values():
        assert [r["order"] for r in level["repeats"]] == [["ours", "vllm"], ["vllm", "ours"], ["ours", "vllm"]]
        assert all(r["settle_s"] == {"ours": 0.25, "vllm": 0.25} for r in level["repeats"])
        for rep in level["repeats"]:
            assert rep["vllm"]["system_tokens_per_s"] == pytest.approx(3 * 6 / 0.5)
            assert rep["ours"]["requests"] == 3 and rep["ours"]["system_tokens_per_s"] > 0
            assert 0 < rep["ours"]["overhead_share"] < 1 and rep["ratio"]["per_request_tokens_per_s"] > 0
    assert {(g["metric"], g["concurrency"]) for g in out["goals"]} == {
        ("per_request_tokens_per_s", 1), ("ttft_p50_s", 1), ("ttft_p50_s", 2)}
    table = markdown(out, "t")
    assert table.startswith("# t") and "| 2 | system_tokens_per_s |" in table
    assert "0.25 s median, 0.25 s at most" in table
    assert vllm_requests_of(reqs)[2].seed == 42 and vllm_requests_of(reqs)[2].prompt_ids == reqs[2].prompt_ids


def test_settle_waits_for_a_quiet_stretch_and_gives_up_at_its_cap():
    def clock():  # 1/16 s a poll (exact in binary), the first reading at the start
        return next(times)

    times = iter(x / 16 for x in range(10_000))
    spinning = iter([0, 6, 12, 18, 24, 30, 31, 31, 31, 31, 31])  # a spin (samples at 1/16 .. 6/16 s), then one tick
    waited = settle(quiet_s=0.25, cap_s=5.0, ticks=spinning.__next__, clock=clock, sleep=lambda s: None)
    assert waited == 10 / 16  # quiet from the sample at 6/16 s (30 ticks) on, a quarter of a second later
    times = iter(x / 16 for x in range(10_000))
    never = iter(range(0, 10_000, 6)).__next__  # a thread that spins throughout
    assert settle(quiet_s=0.25, cap_s=1.0, ticks=never, clock=clock, sleep=lambda s: None) == 1.0
    assert settle(ticks=lambda: None) is None  # nothing to read: no wait


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_busy_ticks_count_a_child_process_that_spins():
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = busy_ticks()
        time.sleep(0.5)
        grown = busy_ticks() - before
    finally:
        child.kill()
        child.wait()
    assert grown >= 20, grown  # about 50 ticks for a spinning child over 0.5 s (at 100 ticks a second)


# ---- the command line: refusals before any model loads ---------------------------------------------------------
def _bench(*args: str):
    from click.testing import CliRunner

    from dspark_bench.cli.main import main

    return CliRunner().invoke(main, ["bench", *args], prog_name="dspark-bench")


@pytest.mark.skipif(vllm_version() is not None, reason="vLLM is installed in this venv: the command would run")
def test_against_vllm_without_vllm_says_how_to_install_it(tmp_path):
    done = _bench("--against", "vllm", "--out", str(tmp_path / "x"))
    assert done.exit_code == 2 and "bench --against vllm needs vLLM" in done.output, done.output
    assert "make vllm-setup" in done.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--against", "vllm", "--drafters", "none,ngram"], "--drafters"),
    (["--against", "vllm", "--no-hf", "--hf-batch", "4"], "--hf-batch, --no-hf"),
    (["--engine-opt", "seed=1"], "--engine-opt is for --against vllm"),
])
def test_options_that_would_be_ignored_are_refused(tmp_path, args, says):
    done = _bench(*args, "--out", str(tmp_path / "x"))
    assert done.exit_code == 2 and says in done.output, done.output


# ---- the real thing: recipes/gpu_engine.sh's vllm stage on CPU at tiny settings ---------------------------------
@pytest.mark.integration
@pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed in this venv: `make vllm-test` runs this "
                                                   "test in .venv-vllm")
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_engine_script_runs_bench_against_vllm_on_cpu(tmp_path):
    """Our embedded target and vLLM's, both engines opened, warmed, interleaved and closed, written and read back."""
    env = {**os.environ, "BIN": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_engine.sh"), str(tmp_path / "out"), "smoke", "vllm"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "vllm" / "vs-vllm.json").read_text())
    assert set(result["levels"]) == {"1", "2"} and result["prompts"] == 2
    for level in result["levels"].values():
        assert [r["order"] for r in level["repeats"]] == [["ours", "vllm"], ["vllm", "ours"]]
        for rep in level["repeats"]:
            for arm in ("ours", "vllm"):
                assert rep[arm]["errors"] == 0 and rep[arm]["requests"] == 2 and rep[arm]["output_tokens"] > 0
                assert rep[arm]["system_tokens_per_s"] > 0 and rep[arm]["ttft_p50_s"] > 0
            assert rep["ratio"]["system_tokens_per_s"] > 0
    assert result["target"]["dtype"] == "fp32" and result["spec"]["seed"] == 980406
    vllm = result["engines"]["vllm"]
    assert vllm["threads"] == result["engines"]["ours"]["torch_threads"] == 1
    assert vllm["environment"] == {"VLLM_CPU_OMP_THREADS_BIND": str(min(os.sched_getaffinity(0)))}
    assert vllm["llm_options"]["enforce_eager"] is True and vllm["llm_options"]["enable_prefix_caching"] is False
    assert vllm["version"] == vllm_version()
    # as many threads as ours: one worker bound to one core. Its OMP_NUM_THREADS may be missing from the record: the
    # vLLM 0.32.0 installed here on 2026-12-07 started its engine core without it in the environment, and the worker
    # held only GOMP_CPU_AFFINITY (the record reads the environment a process started with)
    (worker,) = vllm["workers_omp"]["2"]
    assert worker.get("OMP_NUM_THREADS", "1") == "1" and _bound_cores(worker) == [min(os.sched_getaffinity(0))]
    env = result["environment"]
    assert env["versions"]["vllm"] == vllm_version() and "load_after_1_5_15" in env and env["machine"]["cpu"]
    assert "| 2 | system_tokens_per_s |" in (tmp_path / "out" / "vllm" / "vs-vllm.md").read_text()


def _bound_cores(omp: dict[str, str]) -> list[int] | None:
    """The cores an OpenMP record binds its threads to (GNU, Intel or standard OpenMP's variable), or None."""
    import re

    for key in ("GOMP_CPU_AFFINITY", "KMP_AFFINITY", "OMP_PLACES"):
        if key in omp:
            text = omp[key].split("proclist=", 1)[-1]
            return [int(x) for x in re.findall(r"\d+", text)]
    return None

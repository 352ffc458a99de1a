"""The request-rate sweep's comparisons on synthetic numbers: frontiers, per-user tokens/s at equal system
throughput, the highest rate within a TPOT SLO, and the sweep rows built from synthetic records."""

from __future__ import annotations

import pytest

from dspark_bench.core.records import RequestRecord
from dspark_bench.studies.serving_sweep import (
    RatePoint,
    Sustained,
    compare,
    equal_throughput,
    frontier,
    points_from_rows,
    rate_ratio,
    sustained_rate,
)
from dspark_bench.studies.sweep import serving_block, serving_row

pytestmark = pytest.mark.usefixtures("one_thread")


def _pts(method, xy, rates=None):
    rates = rates or [float(i + 1) for i in range(len(xy))]
    return [RatePoint(method, r, x, y, None) for r, (x, y) in zip(rates, xy, strict=True)]


def test_the_frontier_keeps_the_points_nothing_beats_on_both_axes():
    pts = _pts("m", [(10, 50), (20, 45), (15, 40), (30, 20), (30, 25)])
    assert frontier(pts) == ((10, 50), (20, 45), (30, 25))
    assert frontier([RatePoint("m", 1.0, None, 5.0, None)]) == ()


def test_per_user_ratios_at_the_throughputs_both_reach():
    base = _pts("none fixed", [(10, 50), (20, 40), (30, 20)])
    method = _pts("dspark fixed", [(10, 80), (25, 60), (40, 30)])
    got = equal_throughput(method, base)
    assert [e.system for e in got] == [10, 20, 25, 30]  # 40 lies beyond the baseline's reach: not extrapolated
    assert [e.ratio for e in got] == pytest.approx([80 / 50, (80 - 20 * 10 / 15) / 40, 60 / 30, 50 / 20])
    assert got[1].base_per_user == pytest.approx(40)
    assert equal_throughput(method, _pts("none fixed", [(50, 10)])) == ()  # no common throughput


def _tpot(method, p90s, rates=(0.5, 1.0, 2.0, 4.0), failed=None):
    failed = failed or [0] * len(rates)
    return [RatePoint(method, r, None, None, t, f) for r, t, f in zip(rates, p90s, failed, strict=True)]


def test_the_sustained_rate_interpolates_where_p90_tpot_crosses_the_slo():
    assert sustained_rate(_tpot("m", [100, 150, 300, 900]), 200) == Sustained(pytest.approx(1 + 50 / 150),
                                                                              "interpolated")
    assert sustained_rate(_tpot("m", [80, 90, 120, 150]), 200) == Sustained(4.0, "at_least")
    assert sustained_rate(_tpot("m", [250, 300, 400, 500]), 200) == Sustained(None, "below_range")
    # a rate that lost a request is not sustained, whatever its TPOT
    assert sustained_rate(_tpot("m", [80, 90, 120, 150], failed=[0, 0, 1, 0]), 200) == Sustained(1.0, "interpolated")


def test_rate_ratios_say_whether_they_are_exact_or_bounds():
    inside, top, low = Sustained(2.0, "interpolated"), Sustained(4.0, "at_least"), Sustained(None, "below_range")
    assert rate_ratio(Sustained(3.0, "interpolated"), inside) == (1.5, "exact")
    assert rate_ratio(top, inside) == (2.0, "lower_bound")
    assert rate_ratio(inside, top) == (0.5, "upper_bound")
    assert rate_ratio(top, top) == (None, None) and rate_ratio(inside, low) == (None, None)


def test_compare_every_method_with_none():
    pts = _tpot("none fixed", [100, 150, 300, 900]) + _tpot("dspark hardware-aware", [80, 90, 120, 250])
    (found,) = compare(pts, 200.0)
    assert found.method == "dspark hardware-aware" and found.equal_throughput == ()  # no throughput given
    assert found.sustained.rate == pytest.approx(2 + 80 * 2 / 130)
    assert found.rate_ratio == pytest.approx(found.sustained.rate / (1 + 50 / 150)) and found.rate_ratio_kind == "exact"
    assert compare(pts, None)[0].sustained is None
    assert compare(_tpot("dspark fixed", [1, 2, 3, 4]), 200.0) == []  # no baseline swept: nothing to compare


def _records(rate, tpot_s, n=4, tokens=11, ttft_s=0.1):
    """n requests arriving every 1/rate s, none queued: each TTFT ttft_s, then tokens - 1 at tpot_s each."""
    return [RequestRecord(
        drafter="x", scheduler="fixed", dataset="d", domain="math", prompt_id=f"p{i}", index=i, repeat=0, seed=i,
        concurrency=0, status="ok", finish="length", prompt_len=4, output_ids=tuple(range(tokens)), rounds=(),
        timings=(), ttft_s=ttft_s, decode_s=0.0, arrival_s=i / rate, queue_s=0.0, itl_s=(tpot_s,) * (tokens - 1),
        e2el_s=ttft_s + (tokens - 1) * tpot_s) for i in range(n)]


def test_sweep_rows_from_records_feed_the_comparison():
    rows = []
    for rate in (1.0, 2.0, 4.0):
        for drafter, label, tpot in (("none", "fixed", 0.05 * rate), ("dspark", "hardware-aware", 0.02 * rate)):
            recs = _records(rate, tpot)
            rows.append({"drafter": drafter, "label": label, "request_rate": rate, "n_errors": 0,
                         **serving_row(recs, {"tpot": 120.0})})
    first = rows[0]  # none at 1 req/s: 4 requests of 11 tokens, the last done at 3 + 0.1 + 10 x 0.05 s
    assert first["output_throughput"] == pytest.approx(44 / 3.6)
    assert first["per_user_tokens_per_s"] == pytest.approx(20.0) and first["p90_tpot_ms"] == pytest.approx(50.0)
    assert first["request_goodput"] == pytest.approx(4 / 3.6)
    block = serving_block(rows, {"tpot": 120.0})
    (m,) = block["methods"]
    assert block["baseline"] == "none fixed" and m["method"] == "dspark hardware-aware"
    # none: p90 TPOT 50, 100, 200 ms -> crosses 120 ms at 2 + 20 / 100 x 2; dspark: 20, 40, 80 ms: never
    assert m["base_sustained"] == {"rate": pytest.approx(2.4), "bound": "interpolated"}
    assert m["sustained"] == {"rate": 4.0, "bound": "at_least"} and m["rate_ratio_kind"] == "lower_bound"
    assert m["ratio_min"] > 2.0  # at equal system throughput a user of dspark streams 2.5x as fast here
    assert len(points_from_rows(rows)) == 6


def test_a_rate_sweep_gives_every_cell_of_a_rate_the_same_arrivals(tmp_path, monkeypatch):
    import json

    from conftest import tiny_target

    from dspark_bench.core.arrivals import Arrivals
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.sweep import SweepSpec, read_cell, run_sweep

    target = tiny_target()
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    spec = SweepSpec("tiny", ("ngram-conf",), ("fixed", "threshold"), baselines=("none",), suite="chat", limit=3,
                     max_new_tokens=10, block_size=4, request_rates=(2.0, 50.0), max_concurrency=2,
                     slo={"tpot": 60_000.0})
    run_sweep(spec, target, load_suite("chat", 3), tmp_path / "sweep")
    result = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    rows = result["rows"]
    assert [(r["request_rate"], r["drafter"], r["label"]) for r in rows] == [
        (rate, d, label) for rate in (2.0, 50.0)
        for d, label in (("ngram-conf", "fixed"), ("ngram-conf", "threshold"), ("none", "fixed"))]
    for rate in (2.0, 50.0):
        want = list(Arrivals(rate, 1.0, spec.seed).times(3))
        for row in (r for r in rows if r["request_rate"] == rate):
            recs = sorted(read_cell(tmp_path / "sweep" / row["folder"]), key=lambda r: r.index)
            assert [r.arrival_s for r in recs] == want and row["folder"].endswith(f"__r{rate:g}")
            assert row["output_throughput"] > 0 and row["request_goodput"] > 0 and row["concurrency"] == 2
    methods = {m["method"]: m for m in result["serving"]["methods"]}
    assert set(methods) == {"ngram-conf fixed", "ngram-conf threshold"}
    assert all(m["sustained"] == {"rate": 50.0, "bound": "at_least"} for m in methods.values())


@pytest.mark.parametrize("args, says", [
    (["--request-rate", "1", "--concurrency", "2"], "replaces the --concurrency levels"),
    (["--slo", "tpot=100"], "give --request-rate too"),
    (["--request-rate", "1,0"], "--request-rate must be > 0"),
    (["--request-rate", "1", "--repeats", "2"], "drop --repeats 2"),
    (["--request-rate", "1", "--slo", "speed=3"], "--slo"),
])
def test_the_rate_sweep_refuses_bad_load_before_the_target_loads(args, says, monkeypatch):
    from click.testing import CliRunner

    from dspark_bench.cli import scheduling

    def no_load(*a):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(scheduling, "_load_target", no_load)
    result = CliRunner().invoke(scheduling.sweep, ["--drafter", "ngram", "--baseline", "none", *args])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_the_sweep_table_names_each_cells_request_rate(capsys):
    from dspark_bench.cli.scheduling import _print_rows

    row = {"drafter": "dspark", "label": "fixed", "concurrency": 16, "aggregate_tokens_per_s": 20.0,
           "per_request_tps": 8.0, "mean_verify_budget": 7.5, "waste": 0.9, "tau": 1.5}
    _print_rows([{**row, "request_rate": 0.25}, {**row, "request_rate": 8.0}])
    open_loop = capsys.readouterr().out
    assert "req/s" in open_loop and "0.25" in open_loop and "│     8 │" in open_loop
    _print_rows([{**row, "request_rate": None}])
    assert "req/s" not in capsys.readouterr().out  # closed loop: the concurrency level is the cell

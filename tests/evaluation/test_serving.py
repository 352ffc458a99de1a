"""Serving metrics over records: latencies, throughput over the run's span, goodput under SLOs."""

from __future__ import annotations

import pytest

from dspark_bench.core.records import RequestRecord, record_from_dict, record_to_dict
from dspark_bench.evaluation.serving import parse_slo, request_latencies, serving_summary


def _rec(arrival, queue, ttft, e2el, tokens, itl=(), status="ok"):
    return RequestRecord(
        drafter="none", scheduler="fixed", dataset="gsm8k", domain="math", prompt_id=f"p{arrival}", index=0,
        repeat=0, seed=1, concurrency=1, status=status, finish="length", prompt_len=4,
        output_ids=tuple(range(tokens)), rounds=(), timings=(), ttft_s=ttft, decode_s=0.0,
        arrival_s=arrival, queue_s=queue, itl_s=tuple(itl), e2el_s=e2el)


def test_one_request_latencies():
    lat = request_latencies(_rec(arrival=1.0, queue=0.5, ttft=0.25, e2el=2.75, tokens=11))
    assert lat == {"ttft": 0.75, "tpot": pytest.approx(0.2), "e2el": 2.75, "queue": 0.5}
    assert request_latencies(_rec(0.0, 0.0, 0.1, 0.1, tokens=1))["tpot"] is None


def test_run_summary_throughput_percentiles_and_goodput():
    records = [_rec(0.0, 0.0, 0.1, 1.1, 11, itl=[0.1] * 10),     # ttft 100 ms, tpot 100 ms, ends at 1.1
               _rec(0.5, 0.4, 0.1, 3.5, 11, itl=[0.3] * 10),     # ttft 500 ms, tpot 300 ms, ends at 4.0
               _rec(1.0, 0.0, 0.1, 0.5, 1),                       # one token: no tpot; ends at 1.5
               _rec(2.0, 0.0, 0.1, 9.0, 5, status="error")]      # failed: not completed, not good
    s = serving_summary(records, parse_slo("ttft=200,tpot=150"))
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["duration_s"] == pytest.approx(4.0) and s["output_tokens"] == 23
    assert s["request_throughput"] == pytest.approx(3 / 4) and s["output_throughput"] == pytest.approx(23 / 4)
    assert s["mean_ttft_ms"] == pytest.approx((100 + 500 + 100) / 3)
    assert s["median_tpot_ms"] == pytest.approx(200) and s["p99_itl_ms"] == pytest.approx(300)
    assert s["mean_queue_ms"] == pytest.approx(400 / 3)
    # good: the first (within both) and the one-token request (no tpot, ttft 100 ms); not the slow one
    assert s["good_requests"] == 2 and s["request_goodput"] == pytest.approx(2 / 4)


def test_records_without_serving_fields_give_no_summary_and_keep_their_file_form():
    plain = RequestRecord(
        drafter="none", scheduler="fixed", dataset="d", domain="math", prompt_id="p", index=0, repeat=0, seed=1,
        concurrency=1, status="ok", finish="length", prompt_len=2, output_ids=(1, 2), rounds=(), timings=(),
        ttft_s=0.1, decode_s=0.1)
    assert serving_summary([plain]) is None
    assert "arrival_s" not in record_to_dict(plain)  # closed-loop records are written as before
    timed = _rec(0.0, 0.0, 0.1, 0.3, 3, itl=[0.1, 0.1])
    assert record_from_dict(record_to_dict(timed)) == timed


@pytest.mark.parametrize("text", ["ttft", "ttft=abc", "speed=3", "ttft=0", "ttft=5,ttft=6", ""])
def test_bad_slos_are_refused(text):
    with pytest.raises(ValueError, match="--slo"):
        parse_slo(text)

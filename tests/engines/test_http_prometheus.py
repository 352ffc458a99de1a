"""Reading a server's Prometheus text into speculative counters."""

from __future__ import annotations

from dspark_bench.engines.http.prometheus import parse_prometheus, sglang_accept_length, spec_counters
from dspark_bench.engines.vllm.llm import counter_delta

TEXT = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smol"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="smol"} 2.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smol"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smol"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="1"} 4.0
vllm:num_requests_running{engine="0",model_name="smol"} 0.0
garbage line without value
"""


def test_parse_and_sum_over_engines():
    samples = parse_prometheus(TEXT)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "smol"}, 0.0) in samples
    c = spec_counters(TEXT)
    assert c == {"num_drafts": 12, "num_draft_tokens": 30, "num_accepted_tokens": 14, "accepted_per_pos": [8, 4, 2]}


def test_differences_around_a_run():
    before = spec_counters(TEXT)
    after = spec_counters(TEXT.replace("} 10.0", "} 13.0").replace('position="0"} 8.0', 'position="0"} 10.0'))
    assert counter_delta(before, after) == {"num_drafts": 3, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                            "accepted_per_pos": [2, 0, 0]}


def test_no_speculation_and_sglang():
    assert spec_counters('vllm:num_requests_running{engine="0"} 1.0\n') is None
    assert sglang_accept_length('sglang:spec_accept_length{model_name="m"} 2.5\n') == 2.5
    assert sglang_accept_length(TEXT) is None

"""Per-request speculative totals from servers that give totals, not steps (SGLang, llama.cpp, vLLM's summary)."""

from __future__ import annotations

import pytest

from dspark_bench.core.records import RequestRecord, record_from_dict, record_to_dict
from dspark_bench.engines.http.spec import totals_from_stats, totals_summary


@pytest.mark.parametrize("stats, want", [
    # SGLang with the accepted and drafted counts
    ({"meta_info": {"spec_verify_ct": 4, "spec_accept_token_num": 5, "spec_draft_token_num": 12}},
     ("sglang-meta-info", 10, 5, 12)),
    # older SGLang: only the verify count; 9 tokens after the first over 4 steps -> 5 accepted
    ({"meta_info": {"spec_verify_ct": 4, "spec_accept_length": 2.5}}, ("sglang-meta-info", 10, 5, None)),
    ({"timings": {"predicted_n": 10, "draft_n": 8, "draft_n_accepted": 6}}, ("llama.cpp-timings", 10, 6, 8)),
    ({"metrics": {"spec": {"num_spec_steps": 3, "num_accepted_draft_tokens": 4, "num_draft_tokens": 9}}},
     ("vllm-summary", 10, 4, 9)),
    # a last step that accepted past max_tokens: capped at the tokens after the first
    ({"timings": {"draft_n": 20, "draft_n_accepted": 15}}, ("llama.cpp-timings", 10, 9, 20)),
    # llama.cpp leaves draft_n out where a request drafted nothing (a real response of its ngram-simple server,
    # 2026-12-07, trimmed): none drafted, none accepted. Left out of the totals, such requests would raise τ.
    ({"timings": {"cache_n": 42, "prompt_n": 1, "predicted_n": 10, "predicted_ms": 190.1}},
     ("llama.cpp-timings", 10, 0, 0)),
])
def test_totals_from_each_server(stats, want):
    assert totals_from_stats(stats, 10) == want


@pytest.mark.parametrize("stats", [
    None, {}, {"usage": {"reasoning_tokens": 3}}, {"meta_info": {"e2e_latency": 0.1}},
    {"metrics": {"per_step_drafted": [3], "per_step_accepted": [1], "num_spec_steps": 1,
                 "num_accepted_draft_tokens": 1}},  # steps given: rounds_from_stats reads them, not totals
    {"meta_info": {"spec_verify_ct": "many"}},
    {"meta_info": {"spec_verify_ct": 0, "completion_tokens": 10}},  # SGLang without speculation
])
def test_no_totals_where_the_statistics_give_none_or_give_steps(stats):
    assert totals_from_stats(stats, 10) is None


def test_the_summary_of_totals():
    rows = [("llama.cpp-timings", 10, 6, 8), ("llama.cpp-timings", 5, 0, 4)]
    got = totals_summary(rows)
    # 9 + 4 tokens after the first, 6 accepted -> 7 steps
    assert got == {"source": "llama.cpp-timings", "requests": 2, "accepted": 6, "drafted": 12, "steps": 7,
                   "tau": pytest.approx(13 / 7), "acceptance_rate": 0.5}
    assert totals_summary([("sglang-meta-info", 10, 5, None)])["acceptance_rate"] is None  # drafts not given
    assert totals_summary([]) is None


def test_a_record_keeps_its_totals_and_older_records_read_as_before():
    rec = RequestRecord("server", "server", "gsm8k", "math", "p0", 0, 0, 5, 1, "ok", "length", 9, (7, 8), (), (),
                        0.1, 0.2, spec_totals=("llama.cpp-timings", 2, 1, 3))
    assert record_from_dict(record_to_dict(rec)) == rec
    plain = record_to_dict(RequestRecord("none", "fixed", "gsm8k", "math", "p0", 0, 0, 5, 1, "ok", "length", 9, (7,),
                                         (), (), 0.1, 0.2))
    assert "spec_totals" not in plain and record_from_dict(plain).spec_totals is None

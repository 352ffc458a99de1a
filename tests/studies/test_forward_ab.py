"""The fast-vs-other forward measurement (studies/forward_ab.py): alternation, ratios, and tiny end-to-end runs
against the HF path and against the fast path without packed weights."""

from __future__ import annotations

import pytest
from conftest import random_prompts, tiny_target

from dspark_bench.core.rounds import Request
from dspark_bench.studies.forward_ab import ForwardSpec, Paired, alternate, measure

pytestmark = pytest.mark.usefixtures("one_thread")


def test_calls_alternate_and_the_ratio_is_the_median_of_per_pair_ratios():
    calls = []
    times = iter([1.0, 2.0, 3.0, 3.0, 1.0, 4.0, 2.0, 8.0])  # one warm-up pair, then three timed pairs

    def arm(name):
        return lambda: calls.append(name) or next(times)

    timed = alternate(arm("fast"), arm("hf"), pairs=3, warmup=1)
    assert calls == ["fast", "hf", "fast", "hf", "hf", "fast", "fast", "hf"]  # the odd pair runs the other first
    assert timed == Paired((3.0, 4.0, 2.0), (3.0, 1.0, 8.0))
    assert timed.ratio == 1.0  # median of 1.0, 4.0, 0.25
    assert timed.summary()["pairs"] == 3


@pytest.mark.parametrize(("against", "kernels"), [("hf", ("onednn-packed", "hf")),
                                                  ("fast-unpacked", ("onednn-packed", "torch")),
                                                  ("fast-grouped", ("onednn-packed", "onednn-packed")),
                                                  ("fast-sdpa", ("onednn-packed", "onednn-packed"))])
def test_measure_on_a_tiny_target_reports_every_shape_and_same_tokens(against, kernels):
    from dspark_bench.target.fast import onednn_packs

    target = tiny_target("llama")
    requests = [Request(i, tuple(p), 100 + i) for i, p in enumerate(random_prompts(3, seed=2))]
    spec = ForwardSpec(rows=(1, 2), widths=(1, 4), context=12, step_pairs=2, concurrency=(2,), max_new_tokens=6,
                       generate_pairs=1)
    result = measure(target, requests, spec, against=against)
    assert [(s["rows"], s["width"]) for s in result["steps"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert all(s["ratio_fast_over_other"] > 0 and s["pairs"] == 2 for s in result["steps"])
    assert result["generate"][0]["same_tokens"] is True and result["generate"][0]["requests"] == 3
    assert [(f["prompts"], f["tokens"]) for f in result["prefill"]] == [(2, sum(len(r.prompt_ids) for r in requests[:2]))]
    assert result["prefill"][0]["pairs"] == 3 and result["prefill"][0]["ratio_fast_over_other"] > 0
    assert result["against"] == against
    if onednn_packs(target.dtype, target.device):
        assert (result["linear_kernel"]["fast"], result["linear_kernel"]["other"]) == kernels
    attention = result["attention_kernel"]  # fast-sdpa differs from fast in its attention alone
    assert attention["fast"] == target.attention_kernel
    assert attention["other"] == {"hf": "hf", "fast-sdpa": "sdpa"}.get(against, attention["fast"])


def test_an_unknown_path_to_measure_against_is_refused():
    from dspark_bench.studies.forward_ab import paths

    with pytest.raises(ValueError, match="accepted: hf, fast-unpacked, fast-grouped, fast-sdpa"):
        paths(tiny_target("llama"), "turbo")


def test_spec_refuses_empty_or_non_positive_settings():
    with pytest.raises(ValueError, match="must all be >= 1"):
        ForwardSpec(rows=(0,))
    with pytest.raises(ValueError, match="must all be >= 1"):
        ForwardSpec(concurrency=())

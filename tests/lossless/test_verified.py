"""Which tokens went through verification (lossless/verified.py) and the inconclusive verdict of a check that
sampled too few of them (lossless/vllm.py's power rule, lossless/report.py's verdict)."""

import math

import pytest
import torch

from dspark_bench.lossless.report import ALPHA, BatteryReport, TestResult, finalize
from dspark_bench.lossless.verified import (
    drafted_steps,
    every_step,
    ngram_drafts,
    proposer_rule,
    share,
    verified_mask,
)
from dspark_bench.lossless.vllm import VERIFIED, ks_detectable, ks_needed, with_power


@pytest.mark.parametrize(("n", "context", "drafts"), [
    (1, [5, 6, 7, 5], True),  # the last token occurred before
    (1, [5, 6, 7], False),
    (1, [5], False),
    (2, [1, 2, 3, 1, 2], True),
    (2, [1, 2, 3, 2, 1], False),  # 2, 1 never occurred in that order
    (3, [1, 2, 1, 2], False),  # shorter than a match needs
])
def test_ngram_rule_drafts_when_the_suffix_occurred_earlier(n, context, drafts):
    assert ngram_drafts(n)(context) is drafts


def test_the_walk_places_drafted_steps_by_the_proposers_rule():
    # prompt 1 2 3; output 4 | 1 | 2 3 | 9 9: after "4" nothing matches (plain step), after "1" and after "3" ngram
    # drafts, and vLLM's two drafted steps committed 2 tokens each
    mask = verified_mask((1, 2, 3), [4, 1, 2, 3, 9, 9], [2, 2], ngram_drafts(1))
    assert mask == [False, False, True, True, True, True]
    assert verified_mask((1, 2, 3), [4, 1, 2, 3, 9, 9], [2, 2, 1], ngram_drafts(1)) is None  # a step left over
    assert verified_mask((1, 2, 3), [4, 1, 2, 3, 9, 9], [2], ngram_drafts(1)) is None  # a draft with no step
    assert verified_mask((1, 2, 3), [4, 1, 2, 3, 9, 9], [2, 3], ngram_drafts(1)) == mask  # last step cut at the end
    assert verified_mask((1, 2, 3), [4, 1, 2, 3, 9, 9], [5, 1], ngram_drafts(1)) is None  # an earlier step past it
    assert verified_mask((7,), [1, 2, 3, 4, 5, 6, 7], [2, 1, 3], every_step) == [False] + [True] * 6
    assert verified_mask((7,), [1], [], every_step) == [False]  # the prefill token alone


def test_rules_and_counts_from_a_vllm_config_and_rounds():
    assert proposer_rule(None) is None
    assert proposer_rule({"method": "eagle3", "num_speculative_tokens": 3}) is every_step
    assert proposer_rule({"method": "ngram", "prompt_lookup_min": 2})([1, 2, 1, 2]) is True
    assert proposer_rule({"method": "suffix"}) is None  # unknown: the check refuses it rather than guess
    rounds = ((3, 3, 1, 2), (0, 0, 0, 1), (3, 3, 0, 1), (0, 0, 0, 1))
    assert drafted_steps(rounds) == [2, 1]
    counts = share([[False, True, True, False, True], None], [5, 4], [[2, 1], [4]])
    assert counts == {"tokens": 9, "verified_tokens": 6, "verified_share": 6 / 9, "unaligned_requests": 1}


def test_a_speculative_row_short_of_its_power_is_inconclusive_never_a_pass():
    level = ALPHA / 3
    needed = ks_needed(0.2, level)
    assert ks_detectable(needed, level) <= 0.2 < ks_detectable(needed - 1, level)
    rows = finalize([TestResult("pit-ks", "c | none", 900, 0.02, 0.9),
                     TestResult("pit-ks", "c | ngram", 900, 0.03, 0.8),
                     TestResult(VERIFIED, "c | eagle3", needed, 0.03, 0.8)])
    # ngram: 900 tokens, too few of them verified; eagle3: enough; none: not speculative
    out = with_power(rows, detect=0.2, verified={"c | ngram": needed - 1, "c | eagle3": needed})
    assert [r.verdict for r in out] == ["pass", "inconclusive", "pass"]
    assert out[1].power_n == needed and f"{needed - 1} tokens went through verification" in out[1].detail
    assert out[0].power_n is None
    report = BatteryReport("fast", "t", "fp32", 0, ALPHA, 1.0, out)
    assert not report.ok and report.verdict == "inconclusive"
    failed = (*out, TestResult("chi2-homogeneity", "c | ngram", 10, 50.0, 1e-9, verdict="fail"))
    assert BatteryReport("fast", "t", "fp32", 0, ALPHA, 1.0, failed).verdict == "fail"
    # a failed row stays failed however little was verified
    bad = finalize([TestResult("pit-ks", "c | ngram", 900, 0.3, 1e-12)])
    assert with_power(bad, detect=0.2, verified={"c | ngram": 3})[0].verdict == "fail"


def test_finalize_keeps_a_row_made_inconclusive_out_of_the_family():
    rows = finalize([TestResult(VERIFIED, "c | ngram", 0, math.nan, verdict="inconclusive", detail="none drafted"),
                     TestResult(VERIFIED, "c | x", 50, 0.3, 1e-5, verdict="n/a", expected="n/a"),
                     TestResult("pit-ks", "c | ngram", 100, 0.3, 1e-6)])
    assert [r.verdict for r in rows] == ["inconclusive", "n/a", "fail"]
    assert rows[2].adjusted_p == pytest.approx(1e-6)  # a family of one: the rows not judged are not in it
    assert BatteryReport("fast", "t", "fp32", 0, ALPHA, 1.0, rows[1:2]).ok  # shown, not judged


def test_selected_tokens_of_a_lossless_sampler_stay_uniform_under_the_pit():
    """The selection rule looks only at the past, so PIT values of the selected tokens of an exact sampler are
    uniform: here a two-token chain that 'drafts' after token 1 only, sampled exactly."""
    from dspark_bench.lossless.hypothesis import ks_uniform, randomized_pit

    gen = torch.Generator().manual_seed(3)
    law = torch.tensor([[0.9, 0.1], [0.3, 0.7]], dtype=torch.float64)  # row = previous token
    drafts = ngram_drafts(1)
    values = []
    for _ in range(300):
        out = [0]
        for _ in range(20):
            out.append(int(torch.multinomial(law[out[-1]], 1, generator=gen)))
        mask = verified_mask((1,), out, [1] * sum(drafts([1, *out[:i]]) for i in range(1, len(out))), drafts)
        laws = law[[1, *out[:-1]]]
        pit = randomized_pit(laws, torch.tensor(out), gen)
        values.append(pit[torch.tensor(mask)])
    _, p = ks_uniform(torch.cat(values))
    assert p > 1e-3


def test_vllm_calls_are_grouped_under_a_prompt_token_budget():
    from dspark_bench.lossless.vllm import GROUP_TOKENS, groups

    prompts = [(1,) * 400] * 5 + [(2,) * (GROUP_TOKENS + 5)] + [(3,) * 10]
    got = groups(prompts)
    assert [list(g) for g in got] == [[0, 1], [2, 3], [4], [5], [6]]  # an over-long prompt goes alone
    assert groups([]) == []

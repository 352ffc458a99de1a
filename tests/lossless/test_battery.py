"""Tests of the tests: with fixed seeds every real configuration passes and every negative control fails."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dspark_bench.core.verify import Sampling, speculative_accept, to_probs
from dspark_bench.drafters.base import DraftContext, Slot
from dspark_bench.lossless import battery, cases, checks, exact
from dspark_bench.lossless.controls import Retrospective, appendix_a
from dspark_bench.lossless.report import (
    HEADERS,
    BatteryReport,
    TestResult,
    finalize,
    render_rows,
    report_to_json,
)
from dspark_bench.lossless.synthetic import MarkovChain, SyntheticDrafter, SyntheticTarget, exact_probs
from dspark_bench.scheduling.schedulers import scheduler_names

# Smaller than fast mode, still > 3x every sampled control's n for power 0.99 (at most 450).
SMALL = battery.Plan(gof_n=1500, homogeneity_n=600, pit_requests=32, pit_tokens=32, real_prompts=2, real_tokens=16,
                     real_min_tokens=48, real_block=2)


@pytest.fixture(scope="module")
def synthetic_rows() -> tuple[TestResult, ...]:
    return finalize(battery.synthetic_results(SMALL, [*scheduler_names(), *battery.VARIANTS], seed=0,
                                              say=lambda _m: None))


def test_every_real_configuration_passes(synthetic_rows):
    real = [r for r in synthetic_rows if not r.is_control]
    failed = [(r.test, r.configuration, r.statistic, r.p_value, r.detail) for r in real if r.verdict != "pass"]
    assert not failed
    for s in [*scheduler_names(), *battery.VARIANTS]:  # every scheduler and variant went through every family
        mine = {r.test for r in real if r.configuration.endswith(f"| {s}")}
        assert mine == {"exact", "chi2-gof", "chi2-homogeneity", "pit-ks"}, s


def test_the_sampling_filters_are_checked(synthetic_rows):
    """Exact rows under top-k and under top-p with min-p for every scheduler, the engine's own processing sampled
    against the float64 twin, and the one-sided control detected."""
    by = {(r.test, r.configuration) for r in synthetic_rows if r.verdict == r.expected}
    for s in [*scheduler_names(), *battery.VARIANTS]:
        assert ("exact", f"synthetic topk-v4-k2 | {s}") in by and ("exact", f"synthetic topp-minp-v4-k2-eos | {s}") in by
    assert ("chi2-gof", "synthetic engine-v4-k3-eos+filters | fixed") in by
    assert ("chi2-gof", "control e-filters-on-q-only @ engine-v4-k3-eos+filters") in by
    filtered = [c for c in cases.exact_cases() if c.sampling.filtered]
    assert {c.sampling.top_k > 0 for c in filtered} == {True, False}  # one top-k case, one top-p / min-p case
    for case in filtered:  # the filters cut tokens of p and q in these cases
        assert (case.chain.probs(case.sampling) == 0).any() and (case.draft.chain.probs(case.sampling) == 0).any()


def test_the_float64_twin_is_the_engines_processing():
    """exact_probs (the battery's reference, written apart) and to_probs (the engine's) keep the same tokens and give
    the same law up to float32 rounding, ties and -inf columns included."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 300, generator=g, dtype=torch.float64) * 2
    logits[:16] = logits[:16].round()
    logits[16:20, ::4] = -float("inf")
    for sampling in (Sampling(1.0), Sampling(0.0, top_k=3), Sampling(0.8, top_k=7), Sampling(1.2, top_p=0.6),
                     Sampling(1.0, min_p=0.15), battery.REAL_SAMPLING, Sampling(0.7, top_k=100, top_p=0.95)):
        engine, twin = to_probs(logits.float(), sampling).double(), exact_probs(logits.float().double(), sampling)
        assert torch.equal(engine > 0, twin > 0), sampling
        assert torch.allclose(engine, twin, atol=2e-6), sampling


def test_every_control_is_detected_with_its_power_statement(synthetic_rows):
    controls = [r for r in synthetic_rows if r.is_control]
    names = {c.name for c in cases.controls()}
    assert {r.configuration.split()[1] for r in controls} == names
    assert all(r.verdict == "fail" and r.expected == "fail" for r in controls)
    assert all(r.power_n is not None and r.power_n > 0 for r in controls)
    sampled = [r for r in controls if r.test == "chi2-gof"]
    assert len(sampled) == sum(c.sampled for c in cases.controls())
    assert all(r.n >= 3 * r.power_n for r in sampled)
    report = BatteryReport("test", "-", "fp32", 0, 1e-3, 0.0, synthetic_rows)
    assert report.ok


def test_sampled_rows_are_deterministic():
    case = cases.engine_case()
    runs = [checks.gof_check(case, "det", checks.scheduler_for("threshold", case.sps), speculative_accept, 300, 5)
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_appendix_a_retrospective_law_and_the_early_stop():
    chain, draft = appendix_a()
    target = SyntheticTarget(chain)
    drafter = SyntheticDrafter(draft, target)
    biased = exact.spec_law(exact.Setting(target, drafter, Retrospective(), speculative_accept, 2), 0, 1, False, {})
    assert biased[(0,)] == pytest.approx(0.85, abs=1e-12) and biased[(1,)] == pytest.approx(0.15, abs=1e-12)
    hardware = checks.scheduler_for("hardware-aware", cases.appendix_a_case().sps)  # Algorithm 1, early stop
    fair = exact.spec_law(exact.Setting(target, drafter, hardware, speculative_accept, 2), 0, 1, False, {})
    assert fair[(0,)] == pytest.approx(0.7, abs=1e-12)


def test_synthetic_drafter_hands_over_what_it_samples_and_markov_confidences():
    chain = MarkovChain.random(4, torch.Generator().manual_seed(0))
    confidence = torch.arange(12, dtype=torch.float64).reshape(4, 3) / 12
    target = SyntheticTarget(chain)
    drafter = SyntheticDrafter(SyntheticDrafter.Config(chain, confidence), target)
    slots = [Slot(0, [2], 1, 1), Slot(1, [3], 1, 2)]
    for sampling in (1.0, Sampling(0.9, top_k=2)):
        proposal = drafter.propose(DraftContext(target, sampling, 3, slots))
        probs = chain.probs(sampling).float()
        for r, slot in enumerate(slots):
            prev = [slot.tokens[-1], *proposal.tokens[r, :2].tolist()]
            assert torch.allclose(proposal.q[r], probs[prev])
            assert (proposal.q[r].gather(-1, proposal.tokens[r].unsqueeze(-1)) > 0).all()
            assert proposal.confidence[r].tolist() == pytest.approx([confidence[p, j].item()
                                                                     for j, p in enumerate(prev)])
    assert ((proposal.q > 0).sum(-1) == 2).all()  # top-k 2 of 4 tokens


def test_synthetic_target_keeps_a_cache_like_history():
    target = SyntheticTarget(MarkovChain.iid([0.5, 0.3, 0.2]), eos_ids=(2,))
    batch, out = target.prefill([[0, 1], [1]])
    assert out.logits.shape == (2, 2, 3) and len(out.features[0]) == 2
    step = target.forward_block(batch, torch.tensor([[0, 1, 1], [2, 0, 0]]), [3, 1])
    assert torch.equal(step.logits[0, 2], target.chain.logits[1].float())
    target.keep(batch, [2, 1])
    assert batch.history == [[0, 1, 0, 1], [1, 2]]
    target.drop(batch, [0])
    assert batch.history == [[1, 2]]
    with pytest.raises(ValueError, match="no hidden states"):
        target.forward_block(batch, torch.tensor([[1]]), [1], taps=(0,))


def test_finalize_applies_holm_and_the_control_level():
    rows = [TestResult("chi2-gof", "a", 10, 1.0, 1e-4), TestResult("chi2-gof", "b", 10, 1.0, 0.4),
            TestResult("chi2-gof", "c", 10, 9.0, 1e-5, is_control=True, expected="fail"),
            TestResult("chi2-gof", "d", 10, 9.0, 5e-4, is_control=True, expected="fail"),
            TestResult("exact", "e", 3, 1e-12, bound=1e-9), TestResult("exact", "f", 3, 1e-3, bound=1e-9)]
    out = finalize(rows, alpha=1e-3)
    assert [r.verdict for r in out] == ["fail", "pass", "fail", "pass", "pass", "fail"]
    assert out[0].adjusted_p == pytest.approx(2e-4)  # Holm: 2 real p-values
    report = BatteryReport("fast", "t", "fp32", 0, 1e-3, 1.0, out)
    assert not report.ok
    assert all(len(row) == len(HEADERS) for row in render_rows(report))
    assert json.loads(json.dumps(report_to_json(report)))["rows"][0]["configuration"] == "a"


def test_a_configuration_that_raises_fails_visibly():
    row = checks.guarded("exact", "broken", False, lambda: 1 / 0)
    assert row.verdict == "fail" and math.isnan(row.statistic) and "ZeroDivisionError" in row.detail
    assert report_to_json(BatteryReport("fast", "t", "fp32", 0, 1e-3, 0.0, (row,)))["rows"][0]["statistic"] == "nan"


def test_bad_input_fails_early():
    with pytest.raises(ValueError, match="known"):
        battery.run_battery("fast", drafters=["no-such-drafter"])
    with pytest.raises(ValueError, match="modes"):
        battery.run_battery("slow")


@pytest.mark.integration
def test_real_target_pit_passes():
    """The plain row and the row under the sampling filters (the teacher-forced law processed the same way)."""
    rows = battery.real_results(SMALL, "smollm2-135m", ["dspark"], ["fixed"], seed=0, say=lambda _m: None)
    assert [r.configuration for r in rows] == ["smollm2-135m | dspark | fixed",
                                               f"smollm2-135m | dspark | fixed | {battery.REAL_SAMPLING.label}"]
    for row in rows:
        assert row.test == "pit-ks" and row.n >= SMALL.real_min_tokens
        assert row.p_value > 1e-3 and not row.detail.startswith("error")

"""Tests of the tests: with fixed seeds every real configuration passes and every negative control fails."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dspark_bench.core.verify import speculative_accept
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
from dspark_bench.lossless.synthetic import MarkovChain, SyntheticDrafter, SyntheticTarget
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
    proposal = drafter.propose(DraftContext(target, 1.0, 3, slots))
    probs = chain.probs(1.0).float()
    for r, slot in enumerate(slots):
        prev = [slot.tokens[-1], *proposal.tokens[r, :2].tolist()]
        assert torch.allclose(proposal.q[r], probs[prev])
        assert proposal.confidence[r].tolist() == pytest.approx([confidence[p, j].item() for j, p in enumerate(prev)])


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
    rows = battery.real_results(SMALL, "smollm2-135m", ["ngram"], ["fixed"], seed=0, say=lambda _m: None)
    assert [r.test for r in rows] == ["pit-ks"] and rows[0].n >= SMALL.real_min_tokens
    assert rows[0].p_value > 1e-3 and not rows[0].detail.startswith("error")

"""The battery's statistics against known values: scipy references, hand-computed cases, peers.md's numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dspark_bench.core.verify import Verdict, Verdicts, sample, speculative_accept
from dspark_bench.lossless import exact
from dspark_bench.lossless.controls import Retrospective, appendix_a, resample_from_p
from dspark_bench.lossless.hypothesis import (
    align,
    chi_square_gof,
    chi_square_gof_strata,
    chi_square_homogeneity,
    holm,
    ks_uniform,
    pool_cells,
    randomized_pit,
)
from dspark_bench.lossless.power import effect_size, pooled, power, sample_size
from dspark_bench.lossless.synthetic import SyntheticDrafter, SyntheticTarget

P = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)  # peers.md section 10
Q = torch.tensor([0.15, 0.55, 0.2, 0.1], dtype=torch.float64)


# ---- chi-square and pooling ----------------------------------------------------------------------------------
def test_gof_without_pooling_matches_scipy():
    observed, probs = [18, 22, 31, 29], [0.2, 0.25, 0.3, 0.25]
    res = chi_square_gof(observed, probs)
    ref = stats.chisquare(observed, np.array(probs) * 100)
    assert res.df == 3 and res.groups == (0, 1, 2, 3)
    assert res.statistic == pytest.approx(ref.statistic) and res.p_value == pytest.approx(ref.pvalue)


def test_gof_hand_computed():
    # expected 50, 50; chi2 = (60-50)^2/50 * 2 = 4, df 1
    res = chi_square_gof([60, 40], [0.5, 0.5])
    assert res.statistic == pytest.approx(4.0) and res.p_value == pytest.approx(stats.chi2.sf(4.0, 1))


def test_pooling_hand_case():
    # 1 + 2 < 5, so the next smallest (3) joins; 10 and 20 stay alone
    assert pool_cells([10.0, 1.0, 20.0, 2.0, 3.0]) == (1, 0, 2, 0, 0)
    assert pool_cells([10.0, 20.0]) == (0, 1)  # nothing to pool
    assert pool_cells([1.0, 1.0]) == (0, 0)  # everything below: one group


@pytest.mark.parametrize("seed", range(5))
def test_pooling_keeps_every_group_at_least_five(seed):
    rng = np.random.default_rng(seed)
    expected = rng.dirichlet(np.full(40, 0.3)) * 300
    groups = pool_cells(list(expected))
    mass = pooled(expected, groups)
    assert min(mass) >= 5.0 and max(groups) + 1 == len(mass)


def test_gof_pools_and_flags_impossible_cells():
    probs = [0.45, 0.45, 0.05, 0.04, 0.01, 0.0]  # n = 100: expected 45, 45, 5, 4, 1, 0
    res = chi_square_gof([47, 44, 5, 3, 1, 0], probs)
    assert res.groups[3] == res.groups[4] == res.groups[5] and len(set(res.groups)) == 4 and res.df == 3
    impossible = chi_square_gof([47, 44, 5, 2, 1, 1], probs)
    assert impossible.statistic == math.inf and impossible.p_value == 0.0


def test_homogeneity_matches_scipy_contingency():
    a, b = [30, 25, 45], [35, 30, 35]
    res = chi_square_homogeneity(a, b)
    stat, p, dof, _ = stats.chi2_contingency(np.array([a, b]), correction=False)
    assert res.statistic == pytest.approx(stat) and res.p_value == pytest.approx(p) and res.df == dof


def test_homogeneity_pools_rare_columns():
    a, b = [100, 80, 3, 2, 1], [90, 95, 2, 3, 2]  # rare columns: 5, 5, 3 in all, ~2.5, 2.5, 1.5 expected per row
    res = chi_square_homogeneity(a, b)
    assert res.groups == (1, 2, 0, 0, 0) and res.df == 2


def test_align_takes_the_union_of_cells():
    cells, obs, law = align({(1,): 3, (2,): 1}, {(1,): 0.5, (3,): 0.5})
    assert cells == [(1,), (2,), (3,)] and obs == [3.0, 1.0, 0.0] and law == [0.5, 0.0, 0.5]


# ---- PIT and KS ------------------------------------------------------------------------------------------------
def test_randomized_pit_hand_case():
    gen = torch.Generator().manual_seed(7)
    v = torch.rand(2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]])
    u = randomized_pit(probs, torch.tensor([1, 2]), gen)
    assert u.tolist() == pytest.approx([0.2 + 0.5 * v[0].item(), 0.7 + 0.3 * v[1].item()])


def test_randomized_pit_is_uniform_under_the_true_law():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4000, 6, generator=gen), -1)
    tokens = sample(probs, torch.rand(4000, generator=gen, dtype=torch.float64))
    assert ks_uniform(randomized_pit(probs, tokens, gen))[1] > 0.01
    wrong = probs.roll(1, dims=-1)  # the PIT under another law is not uniform
    assert ks_uniform(randomized_pit(wrong, tokens, gen))[1] < 1e-6


def test_ks_matches_scipy():
    u = np.random.default_rng(3).uniform(size=500) ** 1.1
    d, p = ks_uniform(u)
    ref = stats.kstest(u, "uniform")
    assert d == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


# ---- Holm ------------------------------------------------------------------------------------------------------
def test_holm_textbook_example():
    # sorted: .005 <= .05/4, .01 <= .05/3, .03 > .05/2: stop
    rejected, adjusted = holm([0.01, 0.04, 0.03, 0.005], 0.05)
    assert rejected == [True, False, False, True]
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_rejects_nothing_after_the_first_acceptance():
    rejected, _ = holm([0.001, 0.5, 0.002], 0.003)
    assert rejected == [True, False, False]  # .001 <= .003/3, then .002 > .003/2 stops the procedure


# ---- power -----------------------------------------------------------------------------------------------------
def test_effect_size_and_power_hand_values():
    assert effect_size([0.5, 0.5], [0.6, 0.4]) == pytest.approx(0.04)
    assert effect_size([0.5, 0.5, 0.0], [0.5, 0.4, 0.1]) == math.inf
    assert power(0, 0.04, 1, 0.05) == pytest.approx(0.05)  # no effect: the level
    assert power(1000, 0.04, 1, 1e-3) == pytest.approx(stats.ncx2.sf(stats.chi2.isf(1e-3, 1), 1, 40.0))


def _first_token_law(rule) -> np.ndarray:
    """Exact law of the first emitted token, one draft x ~ Q verified against P (k = 1)."""
    out = np.zeros(4)
    p = torch.stack([P, P])
    for x in range(4):
        for v, w in exact.verdict_law(rule, p, torch.tensor([x]), Q.unsqueeze(0)).items():
            out[x if v.accepted == 1 else v.token] += Q[x].item() * w
    return out


def test_sample_size_matches_peers_numbers():
    # Appendix A retrospective scheduler, through the exact enumerator: (0.85, 0.15) vs (0.7, 0.3): ~295
    chain, draft = appendix_a()
    target = SyntheticTarget(chain)
    setting = exact.Setting(target, SyntheticDrafter(draft, target), Retrospective(), speculative_accept, 2)
    law = exact.spec_law(setting, 0, 1, False, {})
    assert law[(0,)] == pytest.approx(0.85, abs=1e-12)
    n = sample_size(effect_size([0.7, 0.3], [law[(0,)], law[(1,)]]), 1, 1e-3, 0.99)
    assert n == pytest.approx(295, rel=0.03)
    # resample-from-p bug, p = (.5,.2,.2,.1), q = (.15,.55,.2,.1): ~310
    bug = _first_token_law(resample_from_p)
    assert bug == pytest.approx([0.325, 0.27, 0.27, 0.135], abs=1e-12)
    assert sample_size(effect_size(P.numpy(), bug), 3) == pytest.approx(310, rel=0.03)
    # swapped ratio outputs exactly q: ~45
    assert sample_size(effect_size(P.numpy(), Q.numpy()), 3) == pytest.approx(45, rel=0.05)
    assert power(295, effect_size([0.7, 0.3], [0.85, 0.15]), 1, 1e-3) >= 0.99


# ---- exact enumeration -----------------------------------------------------------------------------------------
def test_speculative_accept_is_exactly_lossless_single_step():
    assert _first_token_law(speculative_accept) == pytest.approx(P.numpy(), abs=1e-15)


def test_verdict_law_multi_step_accept_reject_tree():
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 3, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 3, generator=gen, dtype=torch.float64), -1)
    draft = torch.tensor([0, 2, 1])
    law = exact.verdict_law(speculative_accept, p, draft, q)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-14)
    r = [min(1.0, (p[j, draft[j]] / q[j, draft[j]]).item()) for j in range(3)]
    all_accepted = sum(w for v, w in law.items() if v.accepted == 3)
    assert all_accepted == pytest.approx(r[0] * r[1] * r[2], abs=1e-14)
    bonus = {v.token: w for v, w in law.items() if v.accepted == 3}
    assert [bonus.get(t, 0.0) for t in range(3)] == pytest.approx((r[0] * r[1] * r[2] * p[3]).tolist(), abs=1e-14)


def test_verdict_law_of_an_accepted_eos():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    law = exact.verdict_law(speculative_accept, p, torch.tensor([1]), None, eos_ids={1})
    assert law == pytest.approx({Verdict(1, None, eos=True): 0.5, Verdict(0, 0): 0.5})


def test_enumeration_refuses_unscripted_randomness():
    def multinomial_rule(p, draft, q, lengths, draws, eos_ids):
        token = torch.multinomial(p[:, 0], 1).squeeze(1)
        return Verdicts(torch.zeros_like(token), token, torch.zeros_like(token, dtype=torch.bool))

    with pytest.raises(exact.ExactError):
        exact.verdict_law(multinomial_rule, torch.full((1, 3), 1 / 3, dtype=torch.float64), torch.tensor([]), None)


def test_markov_law_truncates_at_eos():
    probs = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    law = exact.markov_law(probs, 0, 3, eos_ids={1})
    assert law == pytest.approx({(1,): 0.5, (0, 1): 0.25, (0, 0, 0): 0.125, (0, 0, 1): 0.125})


def test_ranked_pit_is_uniform_under_the_law_and_sees_unlikely_tokens_that_id_order_misses():
    from dspark_bench.lossless.hypothesis import ks_uniform, randomized_pit, ranked_pit

    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(400, 64, generator=gen, dtype=torch.float64) * 3
    law = torch.softmax(logits, -1)  # [N, V], a concentrated law per row
    exact = torch.multinomial(law, 1, generator=gen).squeeze(-1)
    assert ks_uniform(ranked_pit(law, exact, gen))[1] > 1e-3
    # a broken sampler: one token in four drawn uniformly over the vocabulary instead of from the law
    junk = torch.randint(0, 64, (400,), generator=gen)
    broken = torch.where(torch.rand(400, generator=gen) < 0.25, junk, exact)
    _, p_ranked = ks_uniform(ranked_pit(law, broken, gen))
    _, p_ids = ks_uniform(randomized_pit(law, broken, gen))
    assert p_ranked < 1e-6 and p_ranked < p_ids * 1e-3
    ties = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)  # rank: token 2, then 0, then 1 (ties by id)
    u = ranked_pit(ties.expand(3, 3), torch.tensor([2, 0, 1]), gen)
    assert (0 <= u[0] <= 0.5) and (0.5 <= u[1] <= 0.75) and (0.75 <= u[2] <= 1.0)


def test_strata_add_their_statistics_and_their_degrees_of_freedom():
    a, b = ([30, 20, 50], [0.3, 0.2, 0.5]), ([10, 30, 60], [0.2, 0.3, 0.5])
    ga, gb = chi_square_gof(*a), chi_square_gof(*b)
    both = chi_square_gof_strata([a, b])
    assert both.df == ga.df + gb.df == 4 and both.statistic == pytest.approx(ga.statistic + gb.statistic)
    assert both.p_value == pytest.approx(stats.chi2.sf(both.statistic, 4))
    assert both.groups == (*ga.groups, *(g + 3 for g in gb.groups))
    assert chi_square_gof_strata([a, ([1, 0], [0.0, 1.0])]).p_value == 0.0  # an impossible draw in one stratum

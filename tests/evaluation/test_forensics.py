"""Divergence forensics, pure half: which draw made each output token, margins of uniforms to decision
boundaries, law distances and the verdict."""

from __future__ import annotations

import pytest
import torch

from dspark_bench.core import rng
from dspark_bench.core.records import ResultsError
from dspark_bench.core.verify import sample
from dspark_bench.evaluation import forensics as fx
from dspark_bench.evaluation.forensics import BONUS, DECODE, DRAFT, FIRST, RECOVERED, DrawSite


def _kinds(sites):
    return [(s.kind, s.round, s.slot, s.anchor) for s in sites]


# prompt of 10 tokens: the first token sits at position 10, drawn with key (seed, 9, TARGET)
@pytest.mark.parametrize("rounds, n, expected", [
    ((), 1, [(FIRST, -1, 0, 9)]),  # a request that ended on its first token (EOS or max 1 token)
    (((0, 0, 0, 1), (0, 0, 0, 1)), 3,  # vanilla decoding: decode steps, anchors move by one
     [(FIRST, -1, 0, 9), (DECODE, 0, 0, 10), (DECODE, 1, 0, 11)]),
    (((3, 3, 1, 2), (3, 3, 3, 4)), 7,  # x1 accepted then recovered; a full block then bonus
     [(FIRST, -1, 0, 9), (DRAFT, 0, 0, 10), (RECOVERED, 0, 1, 10),
      (DRAFT, 1, 0, 12), (DRAFT, 1, 1, 12), (DRAFT, 1, 2, 12), (BONUS, 1, 3, 12)]),
    (((4, 4, 2, 2),), 3,  # an accepted EOS at x2 ends the request: no target token
     [(FIRST, -1, 0, 9), (DRAFT, 0, 0, 10), (DRAFT, 0, 1, 10)]),
    (((5, 2, 0, 1), (5, 0, 0, 1)), 3,  # 2 of 5 verified, x1 rejected; a round the scheduler verified nothing
     [(FIRST, -1, 0, 9), (RECOVERED, 0, 0, 10), (DECODE, 1, 0, 11)]),
])
def test_draw_sites_table(rounds, n, expected):
    sites = fx.draw_sites(10, rounds, n)
    assert _kinds(sites) == expected
    assert [s.position for s in sites] == list(range(10, 10 + n))  # output token i sits at prompt_len + i


def test_draw_sites_refuse_rounds_that_do_not_add_up():
    with pytest.raises(ResultsError, match="commit 3 tokens"):
        fx.draw_sites(10, ((1, 1, 1, 2),), 4)
    with pytest.raises(ResultsError, match="committed must be A or A"):
        fx.draw_sites(10, ((3, 3, 1, 3),), 4)
    assert fx.draw_sites(10, (), 0) == []


@pytest.mark.parametrize("a, b, expected", [
    ((1, 2, 3), (1, 2, 3), None), ((1, 2, 3), (1, 5, 3), 1), ((1, 2), (1, 2, 3), 2), ((), (), None),
])
def test_first_divergence(a, b, expected):
    assert fx.first_divergence(a, b) == expected


def test_token_margin_matches_the_sampler():
    w = torch.tensor([0.1, 0.0, 0.3, 0.6])  # cuts at 0.1, 0.1, 0.4, 1.0
    for u in (0.05, 0.2, 0.39, 0.41, 0.99):
        tok = int(sample(w, torch.tensor(u, dtype=torch.float64)))
        assert fx.token_margin(w, u, tok) > 0  # the drawn token is inside, by its margin
    assert fx.token_margin(w, 0.2, 2) == pytest.approx(min(0.2 - 0.1, 0.4 - 0.2))
    assert fx.token_margin(w, 0.2, 3) == pytest.approx(-(0.4 - 0.2))  # u misses token 3 by 0.2
    assert fx.token_margin(w * 7, 0.2, 0) == pytest.approx(-0.1)  # weights need not be normalised
    assert fx.token_margin(w, 0.3, 1) == pytest.approx(-0.2)  # a token without mass: u misses its empty cut


def test_a_uniform_near_a_cut_is_floating_point_and_a_far_one_unexplained():
    """u lies 1e-9 below the cut between tokens 0 and 1 of law a; law b, 1e-7 away, moves the cut below u, so
    run b drew token 1: within the law difference, floating-point. A uniform far from every cut with laws that
    near cannot have drawn two tokens: unexplained."""
    a = torch.tensor([0.5, 0.5], dtype=torch.float64)
    b = torch.tensor([0.5 - 1e-7, 0.5 + 1e-7], dtype=torch.float64)
    u = 0.5 - 1e-9
    assert fx.max_abs(a, b) == pytest.approx(1e-7) and fx.cdf_gap(a, b) == pytest.approx(1e-7)
    margins = [fx.token_margin(a, u, 0), fx.token_margin(b, u, 1)]
    assert margins[0] == pytest.approx(1e-9) and margins[1] > 0
    assert fx.classify(margins, fx.cdf_gap(a, b)) == fx.FLOATING
    far = 0.2
    margins = [fx.token_margin(a, far, 0), fx.token_margin(b, far, 1)]  # b cannot draw token 1 from u = 0.2
    assert margins[1] == pytest.approx(-(0.5 - 1e-7 - 0.2))
    assert fx.classify(margins, fx.cdf_gap(a, b)) == fx.UNEXPLAINED
    assert fx.classify([0.3, 0.3], 1e-7) == fx.UNEXPLAINED  # both inside, far from any cut: not rounding
    with pytest.raises(ValueError):
        fx.classify([], 1.0)


def test_acceptance_tests_and_logit_gaps():
    p, q = torch.tensor([0.2, 0.8]), torch.tensor([0.4, 0.6])
    assert fx.alpha_of(p, q, 0) == pytest.approx(0.5) and fx.alpha_of(p, q, 1) == 1.0
    assert fx.alpha_of(p, None, 1) == pytest.approx(0.8)  # deterministic draft: q(x) = 1
    assert fx.accept_margin(0.3, 0.5, passed=True) == pytest.approx(0.2)
    assert fx.accept_margin(0.3, 0.5, passed=False) == pytest.approx(-0.2)
    logits = torch.tensor([1.0, 3.0, 2.9])
    assert fx.logit_margin(logits, 1) == pytest.approx(0.1)  # the top-2 gap
    assert fx.logit_margin(logits, 2) == pytest.approx(-0.1)  # how far the runner-up trails


def _site(kind, anchor=20, slot=0, verified=3, accepted=0):
    return DrawSite(kind, 2, slot, verified, accepted, anchor)


@pytest.mark.parametrize("a, b, kwargs, expected", [
    (_site(RECOVERED), _site(RECOVERED), {}, ("token", rng.TARGET, 20)),
    (_site(FIRST, anchor=9), _site(FIRST, anchor=9), {}, ("token", rng.TARGET, 9)),
    # one run accepted x2 = its token, the other rejected the same draft (a test) or another one (the drafts)
    (_site(DRAFT, slot=1, accepted=3), _site(RECOVERED, slot=1, accepted=1), {"rejected_b": 7},
     ("test", rng.ACCEPT, 22)),
    (_site(RECOVERED, slot=1, accepted=1), _site(DRAFT, slot=1, accepted=3), {"rejected_a": 9},
     ("test", rng.ACCEPT, 22)),
    (_site(DRAFT, slot=1, accepted=3), _site(RECOVERED, slot=1, accepted=1), {"rejected_b": 8},
     ("draft", rng.DRAFT, 22)),
    (_site(DRAFT, slot=1, accepted=3), _site(DRAFT, slot=1, accepted=2), {}, ("draft", rng.DRAFT, 22)),
    (_site(RECOVERED), _site(BONUS, verified=0), {}, (None, None, None)),  # other widths: no single draw
    (_site(DRAFT), _site(DECODE, verified=0), {}, (None, None, None)),
    (_site(RECOVERED, anchor=20), _site(RECOVERED, anchor=18, slot=2), {}, (None, None, None)),
])
def test_decision_table(a, b, kwargs, expected):
    dec = fx.decision(a, b, 7, 9, greedy=False, **kwargs)
    assert (dec.kind, dec.purpose, dec.position) == expected
    assert (dec.why != "") == (dec.kind is None)


def test_parting_finds_where_the_rounds_parted_before_the_tokens():
    """Run A accepted x2 of round 0 and drew a recovered token after it; run B rejected x2 and drew the same token
    anew, so its next round starts one position earlier: token 4 comes from rounds starting at 12 (A) and 11 (B),
    and the decision to judge is token 2's (accepted draft in A, recovered in B)."""
    a = fx.draw_sites(10, ((3, 3, 2, 3), (3, 3, 0, 1), (3, 3, 0, 1)), 6)
    b = fx.draw_sites(10, ((3, 3, 1, 2), (3, 3, 1, 2), (3, 3, 0, 1)), 6)
    assert [s.kind for s in a[:3]] == [FIRST, DRAFT, DRAFT] and b[2].kind == RECOVERED
    assert (a[4].anchor, b[4].anchor) == (13, 12)
    assert fx.parting(a, b, 4) == 2 == fx.parting(b, a, 4)
    assert fx.decision(a[2], b[2], 7, 7, greedy=False, rejected_b=7).kind == "test"  # the same draft, rejected
    assert fx.decision(a[2], b[2], 7, 7, greedy=False, rejected_b=8).kind == "draft"  # B drafted another token
    assert fx.parting(a, b, 1) is None and fx.parting(a, a, 5) is None  # same rounds at the token: no parting
    assert fx.parting(a, b[:4], 4) is None  # one run has no token 4: nothing to compare


def test_greedy_decision_ignores_round_structure_and_uniforms():
    dec = fx.decision(_site(DECODE, anchor=25, verified=0), _site(DRAFT, anchor=22, slot=3, accepted=4), 1, 2,
                      greedy=True)
    assert (dec.kind, dec.position, dec.uniform(5)) == ("greedy", 26, None)


def _laws(weights, token, logits=None, u_token=None, p=None):
    w = torch.tensor(weights, dtype=torch.float64)
    return fx.Laws(logits=torch.log(w) if logits is None else torch.tensor(logits), p=w if p is None else p,
                   q=None, draft=None, weights=w, u_accept=None, u_token=u_token, token=token, prefix_equal=True,
                   rows=1, width=1)


def test_judge_a_token_draw_near_a_cut():
    site = _site(RECOVERED)
    dec = fx.decision(site, site, 0, 1, greedy=False)
    u = dec.uniform(seed=3)
    a, b = [u + 1e-9, 1 - u - 1e-9], [u - 1e-9, 1 - u + 1e-9]  # the cut sits just above / below u
    j = fx.judge(dec, 3, (0, 1), (site, site), (_laws(a, 0, u_token=u), _laws(b, 1, u_token=u)))
    assert j.verdict == fx.FLOATING and j.u == u and j.difference == pytest.approx(2e-9, rel=1e-3)
    assert not j.notes
    lied = fx.judge(dec, 3, (0, 1), (site, site), (_laws(a, 0, u_token=u), _laws(b, 1, u_token=0.5)))
    assert lied.verdict == fx.UNEXPLAINED and "consumed uniforms" in lied.notes[-1]  # a wrongly keyed draw


def test_judge_a_greedy_near_tie_and_a_wide_gap():
    site = _site(DECODE, verified=0)
    dec = fx.decision(site, site, 0, 1, greedy=True)
    tie = fx.judge(dec, 0, (0, 1), (site, site), (_laws([0.5, 0.5], 0, logits=[2.0, 1.99]),
                                                    _laws([0.5, 0.5], 1, logits=[1.99, 2.0])))
    assert tie.verdict == fx.FLOATING and tie.margins == pytest.approx((0.01, 0.01))
    assert tie.difference == pytest.approx(0.02)
    wide = fx.judge(dec, 0, (0, 1), (site, site), (_laws([0.5, 0.5], 0, logits=[5.0, 1.0]),
                                                     _laws([0.5, 0.5], 0, logits=[5.0, 1.0])))
    assert wide.verdict == fx.UNEXPLAINED  # same logits, other token: no rounding can explain it
    assert "drew token 0 there, not the recorded 1" in wide.notes[0]


def test_incomparable_names_what_differs():
    args = {"target": "smollm2-135m", "seed": 11, "temperature": 1.0, "block_size": 7, "scheduler": "fixed",
            "scheduler_options": {}, "drafters": ["dspark"], "drafter_options": {}, "dtype": "fp32",
            "concurrency": 1}
    prompts = [{"dataset": "humaneval", "prompt_id": "HumanEval/64"}]
    a = {"args": args, "prompts": prompts}
    assert fx.incomparable(a, {"args": {**args, "concurrency": 4, "dtype": "bf16"}, "prompts": prompts}) == []
    assert fx.incomparable(a, {"args": {**args, "top_p": 1.0}, "prompts": prompts}) == []  # unrecorded = off
    assert fx.incomparable(a, {"args": {**args, "top_p": 0.9}, "prompts": prompts}) == ["top_p 1.0 vs 0.9"]
    b = {"args": {**args, "seed": 12, "temperature": 0.7, "drafter_options": {"dspark": {"perturb": "1"}}},
         "prompts": [{"dataset": "humaneval", "prompt_id": "HumanEval/1"}]}
    differ = fx.incomparable(a, b)
    assert differ[:2] == ["seed 11 vs 12", "temperature 1.0 vs 0.7"]
    assert any(d.startswith("suite items") and "HumanEval/64" in d for d in differ)
    assert "drafter options of dspark {} vs {'perturb': '1'}" in differ
    greedy = {**args, "temperature": 0}
    assert fx.incomparable({"args": greedy, "prompts": prompts},
                           {"args": {**greedy, "block_size": 3}, "prompts": prompts}) == []  # argmax: any rounds

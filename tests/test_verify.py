"""The verifier: exact output law (enumerated, float64), greedy table, seeded determinism."""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_bench.verify import (
    Verdict,
    acceptance_probs,
    correction_law,
    residual,
    sample,
    speculative_accept,
    to_probs,
)

EOS = 0


def _law_table(vocab: int, seed: int, depth: int) -> dict[tuple[int, ...], torch.Tensor]:
    """A random conditional law p(. | prefix) for every prefix up to ``depth`` tokens (float64)."""
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(depth + 1):
        for prefix in itertools.product(range(vocab), repeat=n):
            w = torch.rand(vocab, generator=g, dtype=torch.float64) ** 3  # peaky, some near-zero entries
            table[prefix] = w / w.sum()
    return table


def _round_outcomes(ctx, p_of, q_of, k, vocab, eos):
    """Exact law of one verifier round from context ``ctx``: [(probability, emitted tokens)], enumerated with
    the verifier's own ``acceptance_probs`` and ``correction_law``."""
    out = []
    for draft in itertools.product(range(vocab), repeat=k):
        q_rows = [q_of(ctx + draft[:j]) for j in range(k)]
        p_draft = 1.0
        for j in range(k):
            p_draft *= float(q_rows[j][draft[j]])
        if p_draft == 0:
            continue
        p = torch.stack([p_of(ctx + draft[:j]) for j in range(k + 1)])
        q = torch.stack(q_rows)
        alpha = acceptance_probs(p, torch.tensor(draft), q)
        reach = 1.0
        for a in range(k + 1):
            p_a = reach * (1 - float(alpha[a])) if a < k else reach
            if a < k:
                reach *= float(alpha[a])
            if p_a == 0:
                continue
            head = draft[:a]
            if eos in head:  # accepted EOS ends the request, no correction token
                out.append((p_draft * p_a, head[: head.index(eos) + 1]))
                continue
            law = correction_law(p, q, a)
            out.extend((p_draft * p_a * float(law[y]), (*head, y)) for y in range(vocab) if law[y] > 0)
    return out


def _spec_law(ctx, m, p_of, q_of, k, vocab, eos):
    """Law of the first m emitted tokens (EOS-terminated sequences padded with -1), chaining rounds."""
    law: dict[tuple[int, ...], float] = {}
    for prob, emitted in _round_outcomes(ctx, p_of, q_of, k, vocab, eos):
        if len(emitted) >= m or (eos in emitted):
            key = (emitted + (-1,) * m)[:m]
            law[key] = law.get(key, 0.0) + prob
            continue
        for tail, tp in _spec_law(ctx + emitted, m - len(emitted), p_of, q_of, k, vocab, eos).items():
            key = emitted + tail
            law[key] = law.get(key, 0.0) + prob * tp
    return law


def _target_law(ctx, m, p_of, vocab, eos):
    law = {}
    for seq in itertools.product(range(vocab), repeat=m):
        prob, cut = 1.0, m
        for j, y in enumerate(seq):
            prob *= float(p_of(ctx + seq[:j])[y])
            if y == eos:
                cut = j + 1
                break
        key = (seq[:cut] + (-1,) * m)[:m]
        if cut < m and seq[cut:] != (0,) * (m - cut):
            continue  # count each EOS-terminated sequence once
        law[key] = law.get(key, 0.0) + prob
    return law


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("use_eos", [False, True])
def test_exact_output_law_equals_target(k, use_eos):
    vocab, m = 3, 3
    p_tab = _law_table(vocab, seed=1, depth=m + k + 1)
    q_tab = _law_table(vocab, seed=2, depth=m + k + 1)
    eos = EOS if use_eos else -99

    def p_of(prefix):
        return p_tab[prefix[-(m + k + 1):]] if len(prefix) > m + k + 1 else p_tab[prefix]

    def q_of(prefix):
        return q_tab[prefix[-(m + k + 1):]] if len(prefix) > m + k + 1 else q_tab[prefix]

    spec = _spec_law((), m, p_of, q_of, k, vocab, eos)
    want = _target_law((), m, p_of, vocab, eos)
    assert set(spec) <= set(want)
    err = max(abs(spec.get(key, 0.0) - val) for key, val in want.items())
    assert err < 1e-9
    assert abs(sum(spec.values()) - 1.0) < 1e-9


def test_exact_law_with_deterministic_draft():
    """q = None (one-hot) drafts: accept with p(x), residual = p without x."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]], dtype=torch.float64)
    for x in range(3):
        q = torch.nn.functional.one_hot(torch.tensor([x]), 3).double()
        alpha = float(acceptance_probs(p, torch.tensor([x]), q)[0])
        law = alpha * torch.nn.functional.one_hot(torch.tensor(x), 3).double() + (1 - alpha) * correction_law(p, q, 0)
        assert torch.allclose(law, p[0], atol=1e-12)


def test_residual_falls_back_to_p_when_empty():
    p = torch.tensor([0.2, 0.8])
    assert torch.allclose(residual(p, p).float(), p)
    assert torch.allclose(residual(p, torch.tensor([0.6, 0.4])).float(), torch.tensor([0.0, 1.0]))


def _onehot(rows):
    return torch.nn.functional.one_hot(torch.tensor(rows), 6).float()


@pytest.mark.parametrize(
    "p_argmax, draft, eos, want",
    [
        ([1, 2, 3], [1, 2], (), Verdict(2, 3)),  # all accepted: bonus = argmax of the last row
        ([1, 2, 3], [1, 4], (), Verdict(1, 2)),  # second rejected: recovered = target's argmax there
        ([1, 2, 3], [5, 2], (), Verdict(0, 1)),  # first rejected
        ([1, 0, 3], [1, 0], (0,), Verdict(2, None, eos=True)),  # accepted EOS ends without a bonus
        ([0, 2, 3], [5, 2], (0,), Verdict(0, 0)),  # recovered EOS is emitted (the engine then stops)
        ([4], [], (), Verdict(0, 4)),  # no draft: a plain greedy step
    ],
)
def test_greedy_table(p_argmax, draft, eos, want):
    p = to_probs(_onehot(p_argmax) * 5.0, 0.0)
    got = speculative_accept(p, torch.tensor(draft, dtype=torch.long), None, torch.Generator().manual_seed(0), eos)
    assert got == want


def test_temperature_zero_is_one_hot_and_scales():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert to_probs(logits, 0.0).tolist() == [[0.0, 1.0, 0.0]]
    hot, cold = to_probs(logits, 2.0), to_probs(logits, 0.5)
    assert cold[0, 1] > hot[0, 1] and torch.allclose(hot.sum(-1), torch.ones(1))
    with pytest.raises(ValueError, match="temperature"):
        to_probs(logits, -1.0)


def test_seeded_determinism_and_seed_sensitivity():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 50, generator=g), -1)
    q = torch.softmax(torch.randn(3, 50, generator=g), -1)
    draft = torch.tensor([sample(q[j], g) for j in range(3)])
    runs = [speculative_accept(p, draft, q, torch.Generator().manual_seed(s), ()) for s in (7, 7, 8, 9, 10)]
    assert runs[0] == runs[1]
    assert len({(v.accepted, v.token) for v in runs[1:]}) > 1


def test_sample_follows_probs_and_skips_zero_mass():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    g = torch.Generator().manual_seed(3)
    draws = torch.tensor([sample(probs, g) for _ in range(4000)])
    assert set(draws.tolist()) <= {1, 3}
    assert abs((draws == 3).float().mean().item() - 0.75) < 0.03


def test_bad_shapes_rejected():
    with pytest.raises(ValueError, match="k\\+1"):
        speculative_accept(torch.ones(2, 4) / 4, torch.tensor([1, 2]), None, torch.Generator(), ())

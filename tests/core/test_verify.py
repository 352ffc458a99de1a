"""The batched verifier and sampler: exact output law (enumerated, float64, through the batched functions),
greedy table (all rows in one batch), row independence, counter-based uniforms."""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_bench.core import rng
from dspark_bench.core.verify import (
    Draws,
    Verdict,
    acceptance_probs,
    correction_law,
    residual,
    sample,
    sample_block,
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
        alpha = acceptance_probs(p[None], torch.tensor([draft]), q[None])[0]
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
            law = correction_law(p[None], torch.tensor([draft]), q[None], torch.tensor([a]), torch.tensor([k]))[0]
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
        alpha = float(acceptance_probs(p[None], torch.tensor([[x]]), None)[0, 0])
        rest = correction_law(p[None], torch.tensor([[x]]), None, torch.tensor([0]), torch.tensor([1]))[0]
        assert torch.allclose(rest, correction_law(p[None], torch.tensor([[x]]), q[None].float(), torch.tensor([0]),
                                                   torch.tensor([1]))[0], atol=1e-7)
        law = alpha * torch.nn.functional.one_hot(torch.tensor(x), 3).double() + (1 - alpha) * rest
        assert torch.allclose(law, p[0], atol=1e-12)


def test_residual_falls_back_to_p_when_empty():
    p = torch.tensor([0.2, 0.8])
    assert torch.allclose(residual(p, p).float(), p)
    assert torch.allclose(residual(p, torch.tensor([0.6, 0.4])).float(), torch.tensor([0.0, 1.0]))


def _onehot(rows):
    return torch.nn.functional.one_hot(torch.tensor(rows), 6).float()


GREEDY = [
    ([1, 2, 3], [1, 2], (), Verdict(2, 3)),  # all accepted: bonus = argmax of the last row
    ([1, 2, 3], [1, 4], (), Verdict(1, 2)),  # second rejected: recovered = target's argmax there
    ([1, 2, 3], [5, 2], (), Verdict(0, 1)),  # first rejected
    ([1, 0, 3], [1, 0], (0,), Verdict(2, None, eos=True)),  # accepted EOS ends without a bonus
    ([0, 2, 3], [5, 2], (0,), Verdict(0, 0)),  # recovered EOS is emitted (the engine then stops)
    ([4], [], (), Verdict(0, 4)),  # no draft: a plain greedy step
]


def _draws(rows, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Draws(torch.rand(rows, k, generator=g, dtype=torch.float64), torch.rand(rows, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("p_argmax, draft, eos, want", GREEDY)
def test_greedy_table(p_argmax, draft, eos, want):
    p = to_probs(_onehot(p_argmax) * 5.0, 0.0)[None]
    got = speculative_accept(p, torch.tensor([draft], dtype=torch.long).reshape(1, -1), None,
                             torch.tensor([len(draft)]), _draws(1, len(draft)), torch.tensor(eos, dtype=torch.long))
    assert got.to_host() == [want]


def test_greedy_table_as_one_padded_batch():
    """Every row of the table in one call (blocks right-padded to the longest, per-row lengths): each row's
    verdict is the one it gets alone, whatever sits in the padding."""
    k = max(len(d) for _, d, _, _ in GREEDY)
    p = torch.stack([to_probs(_onehot((a + [5] * k)[: k + 1]) * 5.0, 0.0) for a, _, _, _ in GREEDY])
    draft = torch.tensor([(d + [3] * k)[:k] for _, d, _, _ in GREEDY])  # padding: token 3, never read
    lengths = torch.tensor([len(d) for _, d, _, _ in GREEDY])
    got = speculative_accept(p, draft, None, lengths, _draws(len(GREEDY), k), torch.tensor([0]))
    assert got.to_host() == [w for _, _, _, w in GREEDY]  # EOS 0 changes no row whose own table has no EOS


def test_rows_are_independent():
    """R rows verified together give each row exactly its verdict alone (sampling, q given)."""
    g = torch.Generator().manual_seed(4)
    rows, k, vocab = 6, 4, 30
    p = torch.softmax(torch.randn(rows, k + 1, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(rows, k, vocab, generator=g), -1)
    draft = sample(q, torch.rand(rows, k, generator=g, dtype=torch.float64))
    lengths = torch.tensor([4, 0, 2, 4, 1, 3])
    draws = _draws(rows, k, seed=5)
    eos = torch.tensor([7])
    together = speculative_accept(p, draft, q, lengths, draws, eos).to_host()
    for r in range(rows):
        n = int(lengths[r])
        alone = speculative_accept(p[r : r + 1, : n + 1], draft[r : r + 1, :n], q[r : r + 1, :n], lengths[r : r + 1],
                                   Draws(draws.accept[r : r + 1, :n], draws.token[r : r + 1]), eos).to_host()
        assert alone == [together[r]]
    assert len({(v.accepted, v.token) for v in together}) > 1


def test_uniforms_are_a_function_of_the_key():
    seeds, pos = torch.tensor([5, 5, 6]), torch.tensor([[3, 4], [3, 4], [3, 4]])
    u = rng.uniforms(seeds, pos, rng.DRAFT)
    assert torch.equal(u, rng.uniforms(seeds, pos, rng.DRAFT))  # no state
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])  # same seed, same draws; other seed, others
    assert torch.equal(u[:1], rng.uniforms(seeds[:1], pos[:1], rng.DRAFT))  # independent of the batch
    streams = [rng.uniforms(seeds, pos, purpose) for purpose in rng.PURPOSES]
    assert all(not torch.equal(a, b) for i, a in enumerate(streams) for b in streams[i + 1 :])
    mixed = rng.uniforms(seeds, pos, [rng.ACCEPT, rng.TARGET])  # a purpose per column, as the engine asks
    assert torch.equal(mixed[:, 0], streams[1][:, 0]) and torch.equal(mixed[:, 1], streams[2][:, 1])
    with pytest.raises(ValueError, match="purpose"):
        rng.uniforms(seeds, pos, 99)


def _splitmix_reference(seed: int, position: int, purpose: int) -> float:
    """The key's uniform in plain Python integers (mod 2^64), written apart from rng.py's numpy arithmetic."""
    def mix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) % 2**64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
        return x ^ (x >> 31)

    return (mix(mix(seed % 2**64) ^ ((position * 4 + purpose) % 2**64)) >> 11) / 2**53


def test_uniforms_match_a_plain_integer_splitmix():
    """The hash is SplitMix64 on (seed, 4 position + purpose), bit for bit, for negative and 63-bit seeds and any
    input form (lists, tensors): the recorded runs' tokens depend on these exact values."""
    seeds = [0, 1, -1, 980406, 2**62 + 12345, -(2**63)]
    positions = [[0, 1, 7], [5, 6, 2**40], [3, 3, 3], [100, 101, 102], [9, 8, 7], [1, 2, 3]]
    purposes = [rng.ACCEPT, rng.ACCEPT, rng.TARGET]
    expected = [[_splitmix_reference(s, p, t) for p, t in zip(row, purposes, strict=True)]
                for s, row in zip(seeds, positions, strict=True)]
    for form in (lambda x: x, torch.tensor):
        got = rng.uniforms(form(seeds), form(positions), purposes)
        assert got.dtype == torch.float64 and got.tolist() == expected
    assert rng.uniforms([7], [3], rng.DRAFT).tolist() == [_splitmix_reference(7, 3, rng.DRAFT)]


def test_uniforms_are_uniform_and_uncorrelated():
    """Consecutive seeds and positions (how the engine keys them): the values pass a KS test, and neighbouring
    positions are uncorrelated."""
    from scipy.stats import kstest, pearsonr

    u = rng.uniforms(torch.arange(100, 400), torch.arange(64).expand(300, 64), rng.ACCEPT)  # [300, 64]
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    assert abs(pearsonr(u[:, :-1].flatten().numpy(), u[:, 1:].flatten().numpy())[0]) < 0.03
    assert abs(pearsonr(u[:-1].flatten().numpy(), u[1:].flatten().numpy())[0]) < 0.03  # neighbouring seeds


def test_sample_follows_probs_and_skips_zero_mass():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    u = rng.uniforms(torch.arange(4000), torch.zeros(4000, dtype=torch.long), rng.TARGET)
    draws = sample(probs.expand(4000, -1), u)
    assert draws.shape == (4000,) and set(draws.tolist()) <= {1, 3}
    assert abs((draws == 3).float().mean().item() - 0.75) < 0.03
    edge = sample(probs.expand(2, -1), torch.tensor([0.0, 1.0 - 1e-17], dtype=torch.float64))
    assert edge.tolist() == [1, 3]  # u = 0 takes the first token with mass; u -> 1 the last one, never a zero


@pytest.mark.parametrize("vocab", [49152, 151936, 4000])
def test_two_level_sample_is_the_full_inverse_cdf(vocab):
    """The block search of a large vocabulary picks the token one float64 CDF over all V picks, for random laws
    with zero-mass tokens, the edge uniforms, and a strided [R, k, V] slice like the engine's."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, 5, vocab, generator=g) * 4
    logits[..., torch.rand(vocab, generator=g) < 0.3] = -float("inf")
    probs = torch.softmax(logits, -1)[:, :4]  # [6, 4, V], not contiguous across rows
    u = torch.rand(6, 4, dtype=torch.float64, generator=g)
    u[0, 0], u[0, 1] = 0.0, 1.0 - 1e-16
    cdf = torch.cumsum(probs.double(), -1)
    want = torch.searchsorted(cdf, (u.unsqueeze(-1) * cdf[..., -1:]).contiguous(), right=True).squeeze(-1)
    want = torch.minimum(want, torch.searchsorted(cdf, cdf[..., -1:].contiguous()).squeeze(-1))
    assert sample_block(vocab) > 0
    got = sample(probs, u)
    assert torch.equal(got, want)
    assert torch.equal(sample(probs[0, :2], u[0, :2]), want[0, :2])  # under 4 rows: one level, the same tokens
    assert (probs.gather(-1, got.unsqueeze(-1)) > 0).all()


def test_bad_shapes_rejected():
    with pytest.raises(ValueError, match="k\\+1"):
        speculative_accept(torch.ones(1, 2, 4) / 4, torch.tensor([[1, 2]]), None, torch.tensor([2]), _draws(1, 2),
                           torch.tensor([0]))

"""The batched verifier and sampler: exact output law (enumerated, float64, through the batched functions),
greedy table (all rows in one batch), row independence, counter-based uniforms, and the sampling filters
(top-k, top-p, min-p) that make p and q from logits."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dspark_bench.core import rng
from dspark_bench.core.verify import (
    Draws,
    Sampling,
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


# ---- sampling filters ------------------------------------------------------------------------------------------
# A law with a tie at its tail: logits = log of these probabilities, so at T = 1 the tempered law is LAW itself.
LAW = [0.4, 0.25, 0.15, 0.1, 0.1]
TOP2 = [8 / 13, 5 / 13, 0, 0, 0]  # the first two, renormalised
TOP3 = [0.5, 0.3125, 0.1875, 0, 0]


@pytest.mark.parametrize("sampling, want", [
    (Sampling(1.0), LAW),
    (Sampling(1.0, top_k=2), TOP2),
    (Sampling(1.0, top_k=3), TOP3),
    (Sampling(1.0, top_k=4), LAW),  # the 4th is tied with the 5th: ties with the k-th stay
    (Sampling(1.0, top_k=10), LAW),  # k >= V: off
    (Sampling(1.0, top_p=0.6), TOP2),  # 0.4 < 0.6 ahead of 0.25; 0.65 >= 0.6 ahead of 0.15
    (Sampling(1.0, top_p=0.7), TOP3),
    (Sampling(1.0, top_p=0.85), LAW),  # 0.8 ahead of the tie: both stay (a tie is kept or dropped whole)
    (Sampling(1.0, top_p=0.1), [1, 0, 0, 0, 0]),  # the most likely token always stays
    (Sampling(1.0, min_p=0.3), TOP3),  # p >= 0.3 * 0.4 = 0.12
    (Sampling(1.0, min_p=0.5), TOP2),
    (Sampling(1.0, top_k=3, top_p=0.7), TOP2),  # top-p over top-k's renormalised law: 0.8125 ahead of 0.1875
    # vLLM's order: min-p, then top-p over its survivors (0.8125 ahead of the third token: cut). Top-p first (HF's
    # order) would keep three tokens (0.65 < 0.8 ahead of the third) and min-p then none fewer.
    (Sampling(1.0, top_p=0.8, min_p=0.3), TOP2),
    (Sampling(0.5, top_k=2), [0.16 / 0.2225, 0.0625 / 0.2225, 0, 0, 0]),  # T = 0.5 squares the law first
    (Sampling(0.0, top_k=3, top_p=0.2, min_p=0.9), [1, 0, 0, 0, 0]),  # greedy stays greedy
])
def test_sampling_filters_table(sampling, want):
    logits = torch.tensor(LAW).log()
    law = to_probs(logits, sampling)
    assert law.dtype == torch.float32 and law.tolist() == pytest.approx(want, abs=1e-6)
    assert torch.equal(law == 0, torch.tensor(want) == 0)  # cut tokens exactly zero, kept ones not
    assert float(law.sum()) == pytest.approx(1.0, abs=1e-6)


def _reference(row: list[float], s: Sampling) -> list[float]:
    """The filters written out on one row of logits in plain Python floats (the test's own reading of the spec)."""
    e = [math.exp((x - max(row)) / s.temperature) for x in row]
    law = [x / sum(e) for x in e]
    keep = [p >= s.min_p * max(law) for p in law]
    if s.top_k:
        kth = sorted(law, reverse=True)[min(s.top_k, len(law)) - 1]
        keep = [k and p >= kth for k, p in zip(keep, law, strict=True)]
    mass = sum(p for p, k in zip(law, keep, strict=True) if k)
    above = [sum(q for q, k in zip(law, keep, strict=True) if k and q > p) / mass for p in law]
    keep = [k and a < s.top_p for k, a in zip(keep, above, strict=True)]
    kept = [p if k else 0.0 for p, k in zip(law, keep, strict=True)]
    return [p / sum(kept) for p in kept]


def test_sampling_filters_match_a_plain_reading_on_random_rows_with_ties():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(24, 40, generator=g) * 2
    logits[:8] = logits[:8].round()  # ties everywhere
    logits[8:10, ::3] = -float("inf")  # a reduced draft vocabulary's -inf columns
    logits[10] = 0.0  # all tied
    for sampling in (Sampling(0.7, top_k=5), Sampling(1.3, top_p=0.75), Sampling(1.0, min_p=0.2),
                     Sampling(0.9, top_p=0.9, top_k=12, min_p=0.05), Sampling(1.0, top_k=30, top_p=0.5)):
        got = to_probs(logits, sampling)
        for row, law in zip(logits.tolist(), got.tolist(), strict=True):
            want = _reference(row, sampling)
            assert law == pytest.approx(want, abs=2e-6), sampling
            assert [p == 0 for p in law] == [p == 0 for p in want], sampling


def test_top_p_beyond_its_candidates_sorts_in_full():
    """Top-p alone looks for its cut among the most likely tokens first; a flat row whose cut lies further is
    sorted in full, and both paths give the law of the full sort."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 6000, generator=g) * 0.1  # flat: top-p 0.9 keeps thousands of tokens
    logits[0, :5] += 20  # peaked: its cut is among the first candidates
    for rows in (logits[:1], logits):  # the candidates suffice; a row needs the full sort
        law = to_probs(rows, Sampling(1.0, top_p=0.9))
        for row, got in zip(rows.tolist(), law.tolist(), strict=True):
            assert [p == 0 for p in got] == [p == 0 for p in _reference(row, Sampling(1.0, top_p=0.9))]
    assert 1000 < int((to_probs(logits[1], Sampling(1.0, top_p=0.9)) > 0).sum()) < 6000


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 2.5])
def test_top_k_1_is_greedy(temperature):
    logits = torch.randn(4, 3, 500, generator=torch.Generator().manual_seed(5))
    assert torch.equal(to_probs(logits, Sampling(temperature, top_k=1)), to_probs(logits, 0.0))


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0, 1.7])
def test_no_filter_is_plain_temperature_bit_for_bit(temperature):
    logits = torch.randn(3, 2, 49152, generator=torch.Generator().manual_seed(6)) * 3
    plain = to_probs(logits, temperature)
    assert torch.equal(to_probs(logits, Sampling(temperature, top_p=1.0, top_k=0, min_p=0.0)), plain)
    out = torch.empty(3, 2, 49152)
    assert torch.equal(to_probs(logits, Sampling(temperature), out=out), plain) and torch.equal(out, plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7), Sampling(0.0), Sampling(1.3, top_k=50, top_p=0.9),
                                      Sampling(1.0, min_p=0.05)])
def test_a_law_written_into_out_is_the_same_law_bit_for_bit(dtype, sampling):
    """``out`` takes the float32 copy, the temperature, the filters and the softmax in place: the same bits as the
    law made in fresh tensors, whatever the logits' dtype, and the logits untouched."""
    logits = (torch.randn(3, 4, 4096, generator=torch.Generator().manual_seed(8)) * 6).to(dtype)
    before = logits.clone()
    out = torch.full((3, 4, 4096), float("nan"))
    law = to_probs(logits, sampling, out=out)
    assert law.data_ptr() == out.data_ptr() and law.dtype == torch.float32
    assert torch.equal(law, to_probs(logits, sampling)) and torch.equal(logits, before)


def test_filters_leave_the_logits_and_write_into_out():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(7))
    before = logits.clone()
    out = torch.full((2, 50), 7.0)
    law = to_probs(logits, Sampling(1.0, top_k=5, top_p=0.8, min_p=0.1), out=out)
    assert law is out and torch.equal(logits, before)  # T = 1 takes no copy of float32 logits: the mask must
    assert torch.equal(law, to_probs(logits, Sampling(1.0, top_k=5, top_p=0.8, min_p=0.1)))
    assert ((law > 0).sum(-1) <= 5).all()


@pytest.mark.parametrize("kwargs, says", [
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"),
    ({"min_p": 1.0}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"min_p": float("nan")}, "min_p"),
    ({"temperature": -1.0}, "temperature"), ({"temperature": float("inf")}, "temperature"),
])
def test_sampling_refuses_bad_values(kwargs, says):
    with pytest.raises(ValueError, match=f"^{says} must be"):
        Sampling(**{"temperature": 1.0, **kwargs})


def test_sampling_label_and_of():
    assert Sampling(0.8, top_p=0.9, top_k=40, min_p=0.02).label == "T=0.8 top-k=40 top-p=0.9 min-p=0.02"
    assert Sampling(1.0).label == "T=1" and not Sampling(1.0).filtered and Sampling(1.0, top_k=3).filtered
    assert Sampling.of(0.5) == Sampling(0.5) and Sampling.of(s := Sampling(1.0, top_p=0.5)) is s

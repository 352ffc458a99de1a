"""Acceptance math of speculative sampling, batched over R requests: the only module that decides which draft
tokens survive, and the one sampler every draw in the engine goes through.

Notation, fixed once for the whole package (Leviathan et al. 2023; Chen et al. 2023 swap the letters):

* ``p``: the **target** distribution, the law the output must follow. In a round that verifies ``l_r`` draft
  tokens of request r the target is run on ``[current, x_1..x_l]`` and ``p_j`` (j = 0..l) is its distribution
  for the token after slot j, processed as the run samples (:func:`to_probs`).
* ``q``: the **draft** distribution. ``q_j`` is *exactly* the law draft token ``x_j`` was sampled from (same
  sampling, dtype and Markov correction). ``q = None`` means deterministic drafts, i.e. one-hot ``q``.
* **accepted**: draft token ``x_j`` survives with probability ``min(1, p_{j-1}(x_j) / q_j(x_j))`` given that
  ``x_1..x_{j-1}`` survived. ``A`` is the length of the leading run of survivors (at most ``l``).
* **recovered** token: at the first rejection (``A < l``) the target's token is drawn from
  ``normalize(max(0, p_A - q_{A+1}))``.
* **bonus** token: when all ``l`` drafts survive the target's token is drawn from ``p_l``.
* An **EOS among the accepted drafts** ends the request at that EOS, with no recovered or bonus token.

Shapes: a round pads every request's block to the longest, ``k = max_r l_r``: ``p`` [R, k+1, V], ``draft``
[R, k], ``q`` [R, k, V], ``lengths`` [R] (the l_r); slots at or beyond ``l_r`` are padding and never read as
anything but padding. All of it stays on the device it came on; the result is three [R] tensors.

Sampling (:class:`Sampling`: temperature, top-k, top-p, min-p) applies to ``p`` and ``q`` alike through
:func:`to_probs`: ``p`` is the target's *processed* law, the law the output must follow, and each ``q`` the processed
law its token was drawn from. Temperature 0 is the same code with one-hot distributions (greedy). Randomness is an argument (:class:`Draws`): the uniforms of the acceptance
tests and of the recovered/bonus draw, which the engine computes from (request seed, position, purpose) with
:mod:`dspark_bench.core.rng`. Every draw is by inverse CDF with one uniform (:func:`sample`), so a rule's output is
a piecewise-constant function of its uniforms and the exact enumeration of :mod:`dspark_bench.lossless.exact`
integrates it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Below this residual mass the residual is numerically empty; a rejection cannot have happened in exact
# arithmetic then, so the target's own distribution is the right (and lossless) fallback.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one request's block (host values, what drafters' ``commit`` receives).

    accepted: number of leading draft tokens that survived (A).
    token: the recovered or bonus token the target contributes, or None when an accepted EOS ended the request.
    eos: True when an accepted draft token was EOS (the request ends after ``accepted`` tokens).
    """

    accepted: int
    token: int | None
    eos: bool = False

    @property
    def committed(self) -> int:
        """Tokens this round adds to the output (τ of the round)."""
        return self.accepted + (self.token is not None)


@dataclass(frozen=True)
class Verdicts:
    """Outcome of one round for R requests, on the device: accepted [R] long, token [R] long (-1 when an
    accepted EOS ended the request), eos [R] bool."""

    accepted: torch.Tensor
    token: torch.Tensor
    eos: torch.Tensor

    def to_host(self) -> list[Verdict]:
        """Per-request verdicts (one device-to-host copy)."""
        rows = torch.stack([self.accepted, self.token, self.eos.long()], 1).tolist()
        return [Verdict(a, None if e else t, bool(e)) for a, t, e in rows]


@dataclass(frozen=True)
class Draws:
    """The uniforms one round of verification consumes (float64 in [0, 1)): accept [R, k], u_j for the test of
    x_j; token [R], the draw of the recovered or bonus token."""

    accept: torch.Tensor
    token: torch.Tensor


@dataclass(frozen=True)
class Sampling:
    """How a law is made from logits: what users set as temperature, top-k, top-p and min-p.

    Order of operations, as in vLLM's sampler (``vllm/v1/sample/sampler.py``, ``Sampler`` steps 7b-7d: temperature,
    then the argmax-invariant min-p processor, then ``apply_top_k_top_p``; the same order in its model runner v2,
    ``vllm/v1/worker/gpu/sample/sampler.py``):

    1. **temperature** T: logits / T (T = 0: greedy, the one-hot law of the argmax; the filters below always keep
       the argmax, so greedy stays greedy whatever they are);
    2. **min-p** m on the tempered law: keep the tokens with ``p(x) >= m * max p`` (0 = off);
    3. **top-k** k: keep the tokens whose tempered logit is at least the k-th largest, ties with it included (0 = off);
    4. **top-p** P over what steps 2 and 3 kept, renormalised: keep each token whose strictly more likely kept
       tokens carry less than P of that mass, i.e. the smallest most-likely prefix reaching P, a tie kept or
       dropped whole (1 = off; vLLM's sort may split a tie at the cut).

    The processed law is the tempered softmax renormalised over the kept tokens, exactly zero elsewhere. Min-p
    compares ratios to the maximum, which renormalising does not change, so steps 2 and 3 commute and min-p may be
    read on the tempered law; only top-p depends on the order (Hugging Face applies top-k, top-p, then min-p: the
    two differ only when min-p and top-p both cut).
    """

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self):
        if not _real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")  # NaN passes < 0
        if not _real(self.top_p) or not 0 < self.top_p <= 1:  # NaN fails 0 < x
            raise ValueError(f"top_p must be a number in (0, 1] (1: off), got {self.top_p!r}")
        if not isinstance(self.top_k, numbers.Integral) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if not _real(self.min_p) or not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be a number in [0, 1) (0: off), got {self.min_p!r}")

    @property
    def filtered(self) -> bool:
        """True when a filter is on (the law is not the plain tempered softmax)."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0

    @property
    def label(self) -> str:
        """The temperature and the filters that are on, e.g. ``T=0.8 top-k=40 top-p=0.9``."""
        parts = [f"T={self.temperature:g}", *(f"{name}={value:g}" for name, value, off in (
            ("top-k", self.top_k, 0), ("top-p", self.top_p, 1), ("min-p", self.min_p, 0)) if value != off)]
        return " ".join(parts)

    @staticmethod
    def of(sampling: Sampling | float) -> Sampling:
        """``sampling`` itself, or ``Sampling(temperature)`` for a bare temperature."""
        return sampling if isinstance(sampling, Sampling) else Sampling(sampling)


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def to_probs(logits: torch.Tensor, sampling: Sampling | float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sampling distribution for ``logits`` (``[..., V]``) under ``sampling`` (a :class:`Sampling`, or a bare
    temperature), in float32 (written into ``out`` when given: a float32 tensor of the same shape, e.g. one slot
    of a preallocated [R, G, V] law, or a buffer the engine reuses round after round).

    Temperature 0 gives the one-hot distribution of the argmax (greedy decoding), whatever the filters. Without
    filters this is the tempered softmax, bit for bit the same operations as for a bare temperature. With
    ``out`` no temporary of the logits' size is made: the float32 copy, the temperature and the filters are
    applied in ``out``, and the softmax runs in place there (the same operations on the same values, so the same
    bits). The engine passes memory it reuses every round (``Scratch`` in ``engines/native/loop.py`` says why).
    """
    temperature = sampling.temperature if isinstance(sampling, Sampling) else sampling
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        hot = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device) if out is None else out.zero_()
        return hot.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    filtered = isinstance(sampling, Sampling) and sampling.filtered
    if out is None:
        scaled = logits.float() if temperature == 1 else logits.float() / temperature  # x / 1 == x: skip the copy
        if filtered:
            scaled = scaled.masked_fill(scaled < kept_floor(scaled, sampling), float("-inf"))  # logits untouched
        return torch.softmax(scaled, dim=-1)
    if logits.dtype == torch.float32 and temperature == 1 and not filtered:
        return torch.softmax(logits, dim=-1, out=out)
    out.copy_(logits)  # float32, then tempered and filtered in place: logits untouched
    if temperature != 1:
        out.div_(temperature)
    if filtered:
        out.masked_fill_(out < kept_floor(out, sampling), float("-inf"))
    return torch.softmax(out, dim=-1, out=out)  # in place: each element is read before it is written


def kept_floor(scaled: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The smallest tempered logit [..., 1] the filters of ``sampling`` keep, from tempered logits ``scaled``
    ([..., V], float32), in :class:`Sampling`'s order: every filter keeps the tokens at or above a logit, so
    their intersection is one floor. No softmax over V is made for min-p or top-k."""
    vocab, floor, top = scaled.shape[-1], None, None
    if sampling.min_p > 0:  # p(x) >= m * max p  <=>  logit(x) >= max logit + log m
        floor = scaled.amax(-1, keepdim=True) + math.log(sampling.min_p)
    if 0 < sampling.top_k < vocab:
        top = scaled.topk(sampling.top_k, dim=-1).values  # [..., k], descending
        floor = _raise(floor, top[..., -1:])
    if sampling.top_p < 1:
        floor = _raise(floor, _top_p_floor(scaled, floor, top, sampling.top_p))
    return scaled.new_full((*scaled.shape[:-1], 1), float("-inf")) if floor is None else floor


_TOP_P_CANDIDATES = 1024  # top-p without top-k looks for its cut among this many most likely tokens first


def _raise(floor: torch.Tensor | None, other: torch.Tensor) -> torch.Tensor:
    return other if floor is None else torch.maximum(floor, other)


def _top_p_floor(scaled: torch.Tensor, floor: torch.Tensor | None, top: torch.Tensor | None,
                 top_p: float) -> torch.Tensor:
    """Top-p's floor [..., 1] over the tokens at or above ``floor`` (None: all). ``top``: top-k's values
    ([..., k], descending), which hold the cut. Without them the cut is looked for among the
    :data:`_TOP_P_CANDIDATES` most likely tokens (a partial sort: a full one over 49,152 tokens took 7x as
    long on the CPU), and every row is sorted in full only when some row's cut lies beyond them (one host sync)."""
    vocab = scaled.shape[-1]
    masked = scaled if floor is None else scaled.masked_fill(scaled < floor, float("-inf"))
    lse = torch.logsumexp(masked, -1, keepdim=True)  # [..., 1]: log of the kept mass

    def cut(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _cut(values if floor is None else values.masked_fill(values < floor, float("-inf")), lse, top_p)

    if top is not None or vocab <= _TOP_P_CANDIDATES:
        return cut(top if top is not None else scaled.sort(-1, descending=True).values)[0]
    found, inside = cut(scaled.topk(_TOP_P_CANDIDATES, dim=-1).values)
    return found if bool(inside.all()) else cut(scaled.sort(-1, descending=True).values)[0]


def _cut(top: torch.Tensor, lse: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(floor [..., 1], cut inside [...]): the smallest of the descending logits ``top`` ([..., n], -inf where an
    earlier filter cut; ties beyond n share the last value) whose strictly more likely tokens hold less than
    ``top_p`` of the kept mass ``exp(lse)``; and whether a token of ``top`` is dropped (the cut lies within n)."""
    mass = (top - lse).double().exp()  # [..., n], renormalised over the kept tokens
    before = torch.cumsum(mass, -1) - mass  # mass ahead of each position
    first = torch.searchsorted(-top, -top)  # first position of each value's tie (-top ascends)
    above = before.gather(-1, first)  # mass of the strictly more likely tokens
    keep = above < top_p
    return torch.where(keep, top, float("inf")).amin(-1, keepdim=True), (~keep).any(-1)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: one token per row of ``probs`` ([..., V], need not be normalised) from the uniform
    ``u`` ([...], float64), as a long tensor [...] on the same device. Never a token with zero mass: when ``u``
    times the total rounds up to the total, the last token with mass is taken.

    The CDF is float64 throughout. A large vocabulary in four rows or more is searched in two levels, so that
    no [..., V] float64 cumulative sum is made: the CDF of the float64 masses of blocks of :func:`sample_block`
    tokens finds the block that holds ``u`` times the total, and the CDF of that block's own tokens finds the
    token. This is the inverse CDF of the same law as one full cumulative sum; the two differ only in the float64
    rounding of cut points."""
    u = u.to(probs.device).double().unsqueeze(-1)  # [..., 1]
    block = sample_block(probs.shape[-1])
    if not block or u.numel() < _TWO_LEVEL_ROWS:
        cdf = torch.cumsum(probs.double(), dim=-1)
        return _search(cdf, u * cdf[..., -1:])
    blocks = probs.unflatten(-1, (probs.shape[-1] // block, block))  # [..., nb, block], a view
    cdf = torch.cumsum(blocks.double().sum(-1), dim=-1)  # [..., nb]: the block CDF (a cast and a sum beat
    # sum(dtype=float64), which is not vectorised on CPU)
    point = u * cdf[..., -1:]  # [..., 1]: u times the total
    j = _search(cdf, point)  # the block holding the point
    before = torch.where(j > 0, cdf.gather(-1, (j - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1), 0.0)
    inside = blocks.gather(-2, j.view(*j.shape, 1, 1).expand(*j.shape, 1, block)).squeeze(-2).double()
    return j * block + _search(torch.cumsum(inside, dim=-1), point - before.unsqueeze(-1))


_BLOCK = 256  # tokens per block of the two-level search (a power of two)
# Fewer rows than this take one level: at 1-2 rows of 49,152 the two-level search's extra small operations made
# it 1.7-2x slower than one float64 CDF, at 8 and 32 rows it was 5-7x faster (interleaved, one thread, on a
# loaded machine; the engine bench at concurrency 1 saw the sampling share rise 1.1 -> 1.5% with it).
_TWO_LEVEL_ROWS = 4


def sample_block(vocab: int) -> int:
    """Block size of :func:`sample`'s two-level search for a vocabulary of ``vocab`` tokens: the largest power
    of two from 256 down to 32 that divides it into at least 8 blocks, or 0 (one level: a full float64 CDF)."""
    block = _BLOCK
    while block >= 32:
        if vocab % block == 0 and vocab // block >= 8:
            return block
        block //= 2
    return 0


def _search(cdf: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """The first index [...] whose ``cdf`` ([..., n], float64) exceeds ``point`` ([..., 1]), clamped to the last
    index with mass (the first where the CDF reaches its total)."""
    idx = torch.searchsorted(cdf, point.contiguous(), right=True)
    last = torch.searchsorted(cdf, cdf[..., -1:].contiguous(), right=False)
    return torch.minimum(idx, last).squeeze(-1)


def residual_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``max(0, p - q)`` per row ([..., V] each, float64, not normalised), or ``p`` in a row where that mass is
    numerically empty (a rejection cannot have happened there in exact arithmetic)."""
    p = p.double()
    r = (p - q).clamp_min_(0.0)  # float64: q is promoted, exactly
    return torch.where(r.sum(-1, keepdim=True) > _RESIDUAL_EPS, r, p)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The recovered-token law ``normalize(max(0, p - q))`` per row ([..., V] each, float64), falling back to
    ``p`` (normalised) in a row whose residual mass is numerically empty."""
    w = residual_weights(p, q)
    return w / w.sum(-1, keepdim=True)


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """One-hot rows (float32, ``[..., V]``) for deterministic drafts ``tokens`` (``[...]``)."""
    out = torch.zeros(*tokens.shape, vocab, dtype=torch.float32, device=tokens.device)
    return out.scatter_(-1, tokens.long().unsqueeze(-1), 1.0)


def acceptance_probs(
    p: torch.Tensor,  # [R, k+1, V] target distributions (only rows 0..k-1 are read)
    draft: torch.Tensor,  # [R, k] draft tokens
    q: torch.Tensor | None,  # [R, k, V] draft distributions, or None (one-hot)
) -> torch.Tensor:
    """Probability that each draft token passes its test given the earlier ones did, min(1, p(x)/q(x)): [R, k]
    float64."""
    idx = draft.long().unsqueeze(-1)
    p_x = p[:, : draft.shape[1]].gather(-1, idx).squeeze(-1).double()  # gather first: cast k values, not k x V
    q_x = torch.ones_like(p_x) if q is None else q.gather(-1, idx).squeeze(-1).double()
    return torch.where(p_x >= q_x, torch.ones_like(p_x), p_x / q_x)


def correction_weights(
    p: torch.Tensor,  # [R, k+1, V]
    draft: torch.Tensor,  # [R, k]
    q: torch.Tensor | None,  # [R, k, V] or None
    accepted: torch.Tensor,  # [R] long, A
    lengths: torch.Tensor,  # [R] long, l
) -> torch.Tensor:
    """Weights [R, V] (float64, not normalised: :func:`sample` needs no normalisation) of the target's own token
    after ``accepted`` survivors: ``max(0, p_A - q_{A+1})`` at the first rejection (A < l; ``p_A`` where that
    is numerically empty), else the bonus law ``p_l``. :func:`correction_law` is the same law normalised."""
    rows, k = draft.shape
    at = torch.arange(rows, device=p.device)
    p_a = p[at, accepted]  # [R, V]: one row per request (an index copy, not a gather over V)
    if k == 0:
        return p_a.double()
    j = accepted.clamp(max=k - 1)
    q_a = one_hot(draft[at, j], p.shape[-1]) if q is None else q[at, j]
    return residual_weights(p_a, q_a.mul_((accepted < lengths).unsqueeze(-1)))  # q = 0 where the bonus is drawn


def correction_law(
    p: torch.Tensor,  # [R, k+1, V]
    draft: torch.Tensor,  # [R, k]
    q: torch.Tensor | None,  # [R, k, V] or None
    accepted: torch.Tensor,  # [R] long, A
    lengths: torch.Tensor,  # [R] long, l
) -> torch.Tensor:
    """Law [R, V] (float64) of the target's own token after ``accepted`` survivors: the residual at the first
    rejection (A < l), else the bonus law p_l (:func:`correction_weights`, normalised)."""
    w = correction_weights(p, draft, q, accepted, lengths)
    return w / w.sum(-1, keepdim=True)


def check_shapes(p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None, lengths: torch.Tensor) -> None:
    rows, k = draft.shape
    if p.dim() != 3 or tuple(p.shape[:2]) != (rows, k + 1):
        raise ValueError(f"p must be [R, k+1, V] = [{rows}, {k + 1}, V] for drafts [R, k] = [{rows}, {k}], "
                         f"got {list(p.shape)}")
    if q is not None and tuple(q.shape) != (rows, k, p.shape[-1]):
        raise ValueError(f"q must be [R, k, V] = [{rows}, {k}, {p.shape[-1]}], got {list(q.shape)}")
    if tuple(lengths.shape) != (rows,):
        raise ValueError(f"lengths must be [R] = [{rows}], got {list(lengths.shape)}")


def leading_accepts(passed: torch.Tensor) -> torch.Tensor:
    """A [R]: length of the leading run of True in ``passed`` [R, k]."""
    return passed.long().cumprod(1).sum(1)


def eos_stop(draft: torch.Tensor, accepted: torch.Tensor, eos_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(stop [R] bool, accepted [R]): an EOS among the accepted drafts ends the request at the first one."""
    rows, k = draft.shape
    if k == 0:
        return torch.zeros(rows, dtype=torch.bool, device=draft.device), accepted
    is_eos = torch.isin(draft, eos_ids.to(draft.device)) & (torch.arange(k, device=draft.device) < accepted[:, None])
    stop = is_eos.any(1)
    return stop, torch.where(stop, is_eos.long().argmax(1) + 1, accepted)


def speculative_accept(
    p: torch.Tensor,  # [R, k+1, V] target distributions for the slots after current, x_1..x_k
    draft: torch.Tensor,  # [R, k] draft tokens x_1..x_k (padding beyond lengths[r])
    q: torch.Tensor | None,  # [R, k, V] draft distributions, or None for deterministic drafts
    lengths: torch.Tensor,  # [R] verified draft tokens per request (l_r <= k)
    draws: Draws,
    eos_ids: torch.Tensor,  # [n] long
) -> Verdicts:
    """Standard speculative sampling (Leviathan et al. 2023, Algorithm 1) for all R requests at once.

    Steps: (1) x_j passes when ``u_j < min(1, p_{j-1}(x_j) / q_j(x_j))`` and j <= l; (2) A = leading run of
    passes; (3) an accepted EOS ends the request there; (4) otherwise the recovered token from the residual at
    slot A, or the bonus token from ``p_l`` when A = l, drawn with ``draws.token``.
    """
    check_shapes(p, draft, q, lengths)
    k = draft.shape[1]
    if k == 0:  # nothing verified (vanilla decoding, a skipped drafter): the token is drawn from p_0
        none = torch.zeros(draft.shape[0], dtype=torch.long, device=p.device)
        return Verdicts(none, sample(p[:, 0], draws.token), none.bool())
    live = torch.arange(k, device=draft.device) < lengths[:, None]  # [R, k]
    passed = (draws.accept.to(p.device) < acceptance_probs(p, draft, q)) & live  # 1. tests (float64)
    accepted = leading_accepts(passed)  # 2.
    stop, accepted_eos = eos_stop(draft, accepted, eos_ids)  # 3.
    token = sample(correction_weights(p, draft, q, accepted, lengths), draws.token)  # 4.
    return Verdicts(accepted_eos, torch.where(stop, torch.full_like(token, -1), token), stop)


# An acceptance rule maps (p, draft, q, lengths, draws, eos_ids) to Verdicts. The engine takes one as an argument
# so that the lossless battery can inject deliberately wrong rules (negative controls) through the same seam.
AcceptRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, Draws, torch.Tensor], Verdicts
]

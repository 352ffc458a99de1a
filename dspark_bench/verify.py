"""Acceptance math of speculative sampling: the only module that decides which draft tokens survive.

Notation, fixed once for the whole package (Leviathan et al. 2023; Chen et al. 2023 swap the letters):

* ``p``: the **target** distribution, the law the output must follow. In a round that verifies ``k`` draft
  tokens the target is run on ``[current, x_1..x_k]`` and ``p_j`` (j = 0..k) is its distribution for the token
  after slot j, at the sampling temperature.
* ``q``: the **draft** distribution. ``q_k`` is *exactly* the law draft token ``x_k`` was sampled from (same
  temperature, dtype and Markov correction). ``q = None`` means a deterministic draft, i.e. a one-hot ``q``.
* **accepted**: draft token ``x_k`` survives with probability ``min(1, p_{k-1}(x_k) / q_k(x_k))`` given that
  ``x_1..x_{k-1}`` survived. ``A`` is the length of the leading run of survivors.
* **recovered** token: at the first rejection (``A < k``) the target's token is drawn from
  ``normalize(max(0, p_A - q_{A+1}))``.
* **bonus** token: when all ``k`` drafts survive the target's token is drawn from ``p_k``.
* An **EOS among the accepted drafts** ends the request at that EOS, with no recovered or bonus token.

Temperature applies to ``p`` and ``q`` alike through :func:`to_probs`; temperature 0 is the same code with
one-hot distributions (greedy). Randomness comes only from the per-request ``torch.Generator`` passed in:
each call draws ``k`` uniforms for the acceptance tests, then one uniform for the recovered/bonus token.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

# Below this residual mass the residual is numerically empty; a rejection cannot have happened in exact
# arithmetic then, so the target's own distribution is the right (and lossless) fallback.
_RESIDUAL_EPS = 1e-12


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one request's block.

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


def to_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution for ``logits`` (``[..., V]``) at ``temperature``, in float32.

    Temperature 0 gives the one-hot distribution of the argmax (greedy decoding).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token from ``probs`` (``[V]``, need not be normalised) by inverse CDF with one uniform."""
    cdf = torch.cumsum(probs.double(), dim=0)
    u = torch.rand((), generator=generator, dtype=torch.float64).to(probs.device) * cdf[-1]
    idx = int(torch.searchsorted(cdf, u, right=True))
    if idx >= probs.shape[0]:  # u rounded up to the total mass: take the last token with mass, never a zero one
        idx = int(torch.nonzero(probs > 0)[-1])
    return idx


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The recovered-token law ``normalize(max(0, p - q))`` (``[V]`` each), falling back to ``p`` if empty."""
    r = (p.double() - q.double()).clamp_min_(0.0)
    mass = r.sum()
    return p.double() / p.double().sum() if mass <= _RESIDUAL_EPS else r / mass


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """One-hot rows (float32, ``[k, V]``) for a deterministic draft ``tokens`` (``[k]``)."""
    out = torch.zeros(tokens.shape[0], vocab, dtype=torch.float32, device=tokens.device)
    return out.scatter_(-1, tokens.long().unsqueeze(-1), 1.0)


def acceptance_probs(
    p: torch.Tensor,  # [k+1, V] target distributions
    draft: torch.Tensor,  # [k] draft tokens
    q: torch.Tensor,  # [k, V] draft distributions
) -> torch.Tensor:
    """Probability that each draft token passes its test given the earlier ones did: min(1, p(x)/q(x)), [k]."""
    idx = draft.long().unsqueeze(-1)
    p_x = p[: draft.shape[0]].double().gather(-1, idx).squeeze(-1)
    q_x = q.double().gather(-1, idx).squeeze(-1)
    return torch.where(p_x >= q_x, torch.ones_like(p_x), p_x / q_x)


def correction_law(p: torch.Tensor, q: torch.Tensor, accepted: int) -> torch.Tensor:
    """Law of the target's own token after ``accepted`` survivors: residual at the first rejection, else p_k."""
    k = q.shape[0]
    return residual(p[accepted], q[accepted]) if accepted < k else p[k].double()


def speculative_accept(
    p: torch.Tensor,  # [k+1, V] target distributions for the slots after current, x_1..x_k
    draft: torch.Tensor,  # [k] draft tokens x_1..x_k
    q: torch.Tensor | None,  # [k, V] draft distributions, or None for a deterministic draft
    generator: torch.Generator,
    eos_ids: Collection[int] = (),
) -> Verdict:
    """Standard speculative sampling for one request (Leviathan et al. 2023, Algorithm 1).

    Steps: (1) draw k uniforms and pass x_j when ``u_j < min(1, p_{j-1}(x_j) / q_j(x_j))``; (2) A = leading run
    of passes; (3) an accepted EOS ends the request there; (4) otherwise draw the recovered token from the
    residual at slot A, or the bonus token from ``p_k`` when A = k.
    """
    k = int(draft.shape[0])
    if p.shape[0] != k + 1:
        raise ValueError(f"p must have k+1 = {k + 1} rows for k = {k} draft tokens, got {p.shape[0]}")
    if q is None:
        q = one_hot(draft, p.shape[-1])
    # 1. acceptance tests (float64).
    u = torch.rand(k, generator=generator, dtype=torch.float64).to(p.device)
    passed = u < acceptance_probs(p, draft, q)
    # 2. leading run of accepted draft tokens.
    accepted = int(torch.cumprod(passed.long(), 0).sum()) if k else 0
    # 3. EOS among the accepted drafts: stop at the first one, no recovered/bonus token.
    for j, tok in enumerate(draft[:accepted].tolist()):
        if tok in eos_ids:
            return Verdict(accepted=j + 1, token=None, eos=True)
    # 4. recovered token at the first rejection, else the bonus token.
    return Verdict(accepted=accepted, token=sample(correction_law(p, q, accepted), generator))


# An acceptance rule maps (p, draft, q, generator, eos_ids) to a Verdict. The engine takes one as an argument
# so that the lossless battery can inject deliberately wrong rules (negative controls) through the same seam.
AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Generator, Collection[int]], Verdict]

"""Negative controls: deliberately lossy variants injected through the same seams real methods use.

Each is a real bug seen in the wild (reference peers.md sections 8-10) or of such a bug's kind, and must be
*detected* by the battery:

* (a) :func:`resample_from_p`: an :data:`~dspark_bench.core.verify.AcceptRule` that, after a rejection, draws the
  token from ``p`` instead of the residual ``normalize(max(0, p - q))``.
* (b) a ``q`` in the ratio that is not the law the token was drawn from (:class:`SyntheticDrafter` subclasses):
  :class:`ArgmaxSoftmaxQ` drafts the argmax but hands over the softmax; :class:`Bf16Sampled` draws from the
  softmax of bf16-rounded logits but hands over the fp32 softmax. bf16 keeps 8 significant bits, so its grid
  spacing is 1.0 for logits in [128, 256) and 0.125 in [16, 32): :func:`bf16_sensitive_chain` places logits
  ~0.45 spacing off the grid, so rounding moves probabilities by up to ~57% near 150 (detectable by
  construction) or ~6% near 24 (realistic magnitudes: a power statement, see the battery).
  :class:`Bf16Probs` rounds the fp32 softmax itself to bf16 (a relative error of at most 2^-9).
* (c) :func:`exact_match_then_resample`: accept while the draft equals the target's own sample (lossless so
  far), but on a mismatch draw a *fresh* token from ``p`` instead of emitting that sample.
* (d) :class:`Retrospective`: the paper's Appendix A scheduler, a global search over the current round's
  survivals without Algorithm 1's early stop. With a confidence c_2 that depends on x_1 the admission of x_1
  depends on x_1 itself. :func:`appendix_a` builds the paper's example (target (0.7, 0.3), draft (0.5, 0.5),
  c_1 = 0.8, c_2 = 0.9 after A and 0 after B, SPS = 1.0, 0.5, 0.45): the first token's law becomes (0.85, 0.15).
* (e) :class:`FiltersOnQOnly`, (b)'s kind under the sampling filters (top-k, top-p, min-p), which apply to one
  side only: the drafter hands the verifier its processed law as q but draws from its law at the temperature
  alone, as a drafter does that processes the law it reports and not the one it samples. A drafted token the
  filters cut has q = 0, passes its test (p >= 0 = q) and is emitted even where the processed target has no mass.

None of these is registered in the user-facing drafter or scheduler registries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dspark_bench.core.verify import (
    Draws,
    Sampling,
    Verdicts,
    acceptance_probs,
    check_shapes,
    eos_stop,
    leading_accepts,
    sample,
    to_probs,
)
from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.lossless.synthetic import DraftLaw, MarkovChain, SyntheticDrafter
from dspark_bench.scheduling.schedulers import Scheduler

APPENDIX_A_SPS = (1.0, 0.5, 0.45)  # steps/s at 1, 2, 3 batch tokens


def _emit_from_p(p: torch.Tensor, draft: torch.Tensor, accepted: torch.Tensor, draws: Draws,
                 eos_ids: torch.Tensor) -> Verdicts:
    """Stop at an accepted EOS, else draw the target's token from ``p_A`` itself (the controls' shared BUG)."""
    stop, accepted_eos = eos_stop(draft, accepted, eos_ids)
    vocab = p.shape[-1]
    p_a = p.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)  # [R, V]
    token = sample(p_a, draws.token)
    return Verdicts(accepted_eos, torch.where(stop, torch.full_like(token, -1), token), stop)


def resample_from_p(
    p: torch.Tensor,  # [R, k+1, V]
    draft: torch.Tensor,  # [R, k]
    q: torch.Tensor | None,  # [R, k, V] or None
    lengths: torch.Tensor,  # [R]
    draws: Draws,
    eos_ids: torch.Tensor,
) -> Verdicts:
    """Control (a): standard acceptance, but the recovered token is drawn from ``p_A`` (BUG), not the residual."""
    check_shapes(p, draft, q, lengths)
    live = torch.arange(draft.shape[1]) < lengths[:, None]
    passed = (draws.accept < acceptance_probs(p, draft, q)) & live
    return _emit_from_p(p, draft, leading_accepts(passed), draws, eos_ids)


def exact_match_then_resample(
    p: torch.Tensor,  # [R, k+1, V]
    draft: torch.Tensor,  # [R, k]
    q: torch.Tensor | None,  # [R, k, V] or None (ignored: exact match does not read q)
    lengths: torch.Tensor,  # [R]
    draws: Draws,
    eos_ids: torch.Tensor,
) -> Verdicts:
    """Control (c): the target samples its own token at each slot (with that slot's acceptance uniform) and
    accepts on equality; on a mismatch it emits a fresh draw from ``p`` (BUG: emitting its own sample would be
    lossless)."""
    check_shapes(p, draft, q, lengths)
    k = draft.shape[1]
    own = sample(p[:, :k], draws.accept)  # [R, k]
    passed = (own == draft) & (torch.arange(k) < lengths[:, None])
    return _emit_from_p(p, draft, leading_accepts(passed), draws, eos_ids)


class ArgmaxSoftmaxQ(SyntheticDrafter):
    """Control (b1): drafts the argmax of its logits but hands the verifier their softmax as q."""

    name = "control-argmax-softmax-q"

    def law(self, sampling: Sampling) -> DraftLaw:
        logits = self.config.chain.logits
        return DraftLaw(logits, 0.0, logits, sampling)


class Bf16Sampled(SyntheticDrafter):
    """Control (b2): samples from the softmax of bf16-rounded logits, hands over the fp32 softmax as q."""

    name = "control-bf16-sampled"

    def law(self, sampling: Sampling) -> DraftLaw:
        logits = self.config.chain.logits
        return DraftLaw(logits.to(torch.bfloat16).double(), sampling, logits, sampling)


class Bf16Probs(SyntheticDrafter):
    """Control (b3): samples from its softmax rounded to bf16 *probabilities* (relative error <= 2^-9), hands
    over the fp32 softmax. Too small to sample at any CI size: the battery reports its exact error and power."""

    name = "control-bf16-probs"

    def law(self, sampling: Sampling) -> DraftLaw:
        logits = self.config.chain.logits
        rounded = to_probs(logits, sampling).to(torch.bfloat16).double()
        return DraftLaw(rounded.log(), 1.0, logits, sampling)  # softmax(log r) = r / sum(r), as sample() does


class FiltersOnQOnly(SyntheticDrafter):
    """Control (e): draws at the run's temperature without its filters, hands over the filtered q."""

    name = "control-filters-on-q-only"

    def law(self, sampling: Sampling) -> DraftLaw:
        logits = self.config.chain.logits
        return DraftLaw(logits, sampling.temperature, logits, sampling)


def bf16_sensitive_chain(vocab: int, generator: torch.Generator, magnitude: float) -> MarkovChain:
    """Logits near ``magnitude``, each 0.45 grid steps off bf16's grid there (spacing 2^(e - 7) for logits in
    [2^e, 2^(e+1))), randomly below or above it: rounding moves every logit by ~0.45 spacing."""
    spacing = 2.0 ** (math.floor(math.log2(magnitude)) - 7)
    grid = magnitude - magnitude % spacing + spacing * torch.randint(0, 4, (vocab, vocab), generator=generator)
    side = torch.where(torch.rand(vocab, vocab, generator=generator) < 0.5, -0.45, 0.45) * spacing
    return MarkovChain((grid + side).double())


@dataclass(frozen=True)
class Retrospective(Scheduler):
    """Control (d): Theta = E * SPS(B) over the current round's ranked survivals, keeping the best prefix of
    the ranking found by a global search (no early stop). ``sps[b - 1]`` is SPS at b batch tokens (the last
    value beyond the table)."""

    name = "control-retrospective"
    sps: tuple[float, ...] = APPENDIX_A_SPS

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        if proposal.confidence is None:
            raise ValueError("the retrospective control needs confidences")
        conf = proposal.confidence.double().cpu().clamp(0.0, 1.0)
        rows, k = conf.shape
        surv = torch.cumprod(conf, 1) * (torch.arange(k) < proposal.lengths.unsqueeze(1))
        ranked = sorted((-float(surv[r, j]), r, j) for r in range(rows) for j in range(k) if surv[r, j] > 0)
        best, best_n, expected = rows * self._sps(rows), 0, float(rows)
        for n, (neg_a, _, _) in enumerate(ranked, start=1):
            expected -= neg_a
            theta = expected * self._sps(rows + n)
            if theta > best:  # BUG: no break on the first non-improvement (Algorithm 1's early stop)
                best, best_n = theta, n
        lengths = torch.zeros(rows, dtype=torch.long)
        for _, r, _ in ranked[:best_n]:
            lengths[r] += 1
        return lengths

    def _sps(self, tokens: int) -> float:
        return self.sps[min(tokens, len(self.sps)) - 1]


def appendix_a() -> tuple[MarkovChain, SyntheticDrafter.Config]:
    """The paper's Appendix A: i.i.d. target (0.7, 0.3) and draft (0.5, 0.5); c_1 = 0.8 whatever the context,
    c_2 = 0.9 after x_1 = A (token 0) and 0 after x_1 = B (token 1). Returns (target chain, draft config)."""
    confidence = torch.tensor([[0.8, 0.9], [0.8, 0.0]], dtype=torch.float64)
    return MarkovChain.iid([0.7, 0.3]), SyntheticDrafter.Config(MarkovChain.iid([0.5, 0.5]), confidence)

"""``ngram-conf``: prompt lookup (as ``ngram``) that also predicts conditional confidences c_k.

Model-free, so confidence-reading schedulers (threshold, hardware-aware, async) can be exercised and measured
without a trained DSpark checkpoint. The confidence of x_k depends only on x_1..x_{k-1} (non-anticipating).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.drafters.ngram import NgramDrafter, lookup
from dspark_bench.drafters.registry import register


def agreement_confidence(tokens: Sequence[int], n: int, draft: Sequence[int]) -> list[float]:
    """c_k for a prompt-lookup draft continuing the last ``n`` tokens: among earlier occurrences of that suffix
    whose continuation agreed with x_1..x_{k-1} and reaches offset k, the share continuing with x_k, shrunk
    towards 0 by one pseudo-miss: c_k = agree_k / (matches_k + 1). Depends on x_1..x_{k-1} only (Markov)."""
    size, suffix = len(tokens), list(tokens[len(tokens) - n:])
    alive = [s + n for s in range(size - n) if list(tokens[s:s + n]) == suffix]  # continuation starts
    out = []
    for k, x in enumerate(draft):
        reach = [c for c in alive if c + k < size]
        agree = [c for c in reach if tokens[c + k] == x]
        out.append(len(agree) / (len(reach) + 1))
        alive = agree
    return out


@register("ngram-conf")
class ConfidentNgram(NgramDrafter):
    """Prompt lookup (as ``ngram``) that also predicts conditional confidences (:func:`agreement_confidence`),
    so confidence schedulers can run without a trained model."""

    @dataclass(frozen=True)
    class Config(NgramDrafter.Config):
        calibration: str | None = None  # calibration.json for the schedulers that read confidences

    def propose(self, ctx: DraftContext) -> Proposal:
        base = super().propose(ctx)
        conf = torch.zeros(base.tokens.shape, dtype=torch.float32)
        for r, slot in enumerate(ctx.slots):
            n_draft = int(base.lengths[r])
            if n_draft:
                n = self._match_length(slot.tokens, base.tokens[r, :n_draft].tolist())
                conf[r, :n_draft] = torch.tensor(agreement_confidence(slot.tokens, n, base.tokens[r, :n_draft].tolist()))
        return Proposal(base.tokens, base.lengths, base.q, conf)

    def _match_length(self, tokens: Sequence[int], draft: Sequence[int]) -> int:
        """The suffix length whose most recent earlier match produced ``draft`` (as ``ngram.lookup`` chose)."""
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            if lookup(tokens, n, n, len(draft)) == list(draft):
                return n
        return self.config.min_ngram

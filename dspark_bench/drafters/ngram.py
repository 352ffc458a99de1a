"""``ngram``: prompt-lookup decoding (model-free).

Find the most recent earlier occurrence of the context's last n tokens (longest n first, from ``max_ngram``
down to ``min_ngram``) and propose the tokens that followed it. The draft is deterministic (q = None), as in
the prompt-lookup baselines of vLLM, HF transformers and Spec-Bench.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.drafters.registry import DrafterError, register


def lookup(tokens: Sequence[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Continuation (at most ``k`` tokens) of the most recent earlier match of the longest matching suffix."""
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = list(tokens[n_tokens - n :])
        first = suffix[0]
        # scan start positions from the most recent backwards; a match must leave at least one token after it
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start] == first and list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : start + n + k])
    return []


@register("ngram")
class NgramDrafter(Drafter):
    @dataclass(frozen=True)
    class Config:
        max_ngram: int = 3
        min_ngram: int = 1

    def __init__(self, config: Config, target):
        if not 1 <= config.min_ngram <= config.max_ngram:
            raise DrafterError(f"ngram needs 1 <= min_ngram <= max_ngram, got {config.min_ngram}, {config.max_ngram}")
        super().__init__(config, target)

    def propose(self, ctx: DraftContext) -> Proposal:
        drafts = [lookup(s.tokens, self.config.max_ngram, self.config.min_ngram, ctx.block_size) for s in ctx.slots]
        width = max((len(d) for d in drafts), default=0)
        tokens = torch.zeros(len(drafts), width, dtype=torch.long)
        for r, d in enumerate(drafts):
            tokens[r, : len(d)] = torch.tensor(d, dtype=torch.long)
        return Proposal(tokens, torch.tensor([len(d) for d in drafts], dtype=torch.long))

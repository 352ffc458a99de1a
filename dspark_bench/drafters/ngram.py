"""``ngram``: prompt-lookup decoding (model-free).

Find the most recent earlier occurrence of the context's last n tokens (longest n first, from ``max_ngram``
down to ``min_ngram``) and propose the tokens that followed it. The draft is deterministic (q = None), as in
the prompt-lookup baselines of vLLM, HF transformers and Spec-Bench.

:func:`lookup` states the rule as a scan of the whole context; the drafter keeps an index per request
(:class:`NgramIndex`) that gives the same answer from the tokens added since its last round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dspark_bench.drafters.base import DraftContext, Drafter, Proposal, Slot
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


class NgramIndex:
    """Where each n-gram (``min_ngram`` <= n <= ``max_ngram``) of a growing token list last occurred with a token
    after it: :func:`lookup`'s answer from a dictionary read per n instead of a scan back through the whole list
    (40-110 us per request and round in Python at 400-800 tokens, measured while another job ran). The list may
    only grow between calls (a request's tokens do); a shorter one is indexed afresh."""

    def __init__(self, max_ngram: int, min_ngram: int):
        self.sizes = range(min_ngram, max_ngram + 1)
        self._clear()

    def _clear(self) -> None:
        self.last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.done = 0  # every n-gram ending before this index (so followed by a token) is indexed

    def update(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self.done:
            self._clear()
        for end in range(self.done, len(tokens)):  # n-grams [end - n, end), followed by tokens[end]
            for n in self.sizes:
                if end >= n:
                    self.last[n][tuple(tokens[end - n : end])] = end - n  # later starts overwrite earlier ones
        self.done = len(tokens)

    def lookup(self, tokens: Sequence[int], k: int) -> list[int]:
        """:func:`lookup` of ``tokens`` (indexed first), at most ``k`` tokens."""
        self.update(tokens)
        size = len(tokens)
        for n in range(min(self.sizes[-1], size - 1), self.sizes[0] - 1, -1):
            start = self.last[n].get(tuple(tokens[size - n :]))
            if start is not None:
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

    def begin(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:
        for s in slots:
            s.state = NgramIndex(self.config.max_ngram, self.config.min_ngram)

    def end(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:
        for s in slots:
            s.state = None

    def propose(self, ctx: DraftContext) -> Proposal:
        for s in ctx.slots:
            if not isinstance(s.state, NgramIndex):  # a slot this drafter did not begin (a caller of propose alone)
                s.state = NgramIndex(self.config.max_ngram, self.config.min_ngram)
        drafts = [s.state.lookup(s.tokens, ctx.block_size) for s in ctx.slots]
        width = max((len(d) for d in drafts), default=0)
        tokens = torch.zeros(len(drafts), width, dtype=torch.long)
        for r, d in enumerate(drafts):
            tokens[r, : len(d)] = torch.tensor(d, dtype=torch.long)
        return Proposal(tokens, torch.tensor([len(d) for d in drafts], dtype=torch.long))

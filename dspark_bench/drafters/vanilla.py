"""``none``: vanilla autoregressive decoding, i.e. the drafter that proposes nothing.

Run by the same engine loop as every other method, so each round is one plain target step and the baseline
is timed by the same clock and counted by the same counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.drafters.registry import register


@register("none")
class NoDraft(Drafter):
    @dataclass(frozen=True)
    class Config:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal.empty(len(ctx.slots))

"""``dflash``: DFlash as DeepSeek implements it (reference 2.1): the DSpark block backbone without the Markov and
confidence heads. All G tokens are sampled independently, ``x_k ~ q_k = to_probs(U_k, sampling)``; the loss is the
weighted cross-entropy alone (decay gamma_w as for DSpark).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.drafters.blockdraft import BlockDraftModel
from dspark_bench.drafters.blockdrafter import BlockConfig, BlockDrafter
from dspark_bench.drafters.blockloss import (
    acceptance_by_position,
    analytic_acceptance,
    cross_entropy,
    position_weights,
    tv_l1,
    weighted_mean,
)
from dspark_bench.drafters.registry import register
from dspark_bench.drafters.types import LossOutput

if TYPE_CHECKING:
    from dspark_bench.drafters.types import TrainBatch
    from dspark_bench.target.model import Target


class DFlashModel(BlockDraftModel):
    def loss(self, batch: TrainBatch, generator: torch.Generator, num_anchors: int, decay_gamma: float) -> LossOutput:
        """Weighted CE over ``num_anchors`` random anchors per sequence; acceptance from ||q - pi||_1."""
        view = self.train_view(batch, generator, num_anchors)
        t = view.targets
        logits = self.draft_head.sub_logits(view.h)  # over the draft vocabulary (vocab.py: labels outside dropped)
        weights = position_weights(t.validity, decay_gamma)
        loss = weighted_mean(cross_entropy(logits, view.labels), weights * view.in_vocab)
        with torch.no_grad():
            alpha = analytic_acceptance(tv_l1(torch.softmax(logits, dim=-1), view.pi))
        return LossOutput(loss, {"loss": float(loss.detach()), "ce": float(loss.detach())}, acceptance_by_position(alpha, t.validity))


@register("dflash")
class DFlashDrafter(BlockDrafter):
    @dataclass(frozen=True)
    class Config(BlockConfig):
        pass

    Model = DFlashModel

    def arch_fields(self, config: Config, target: Target) -> dict[str, Any]:
        return {**super().arch_fields(config, target), "markov_rank": 0, "confidence_head": False}

    def draw(self, ctx: DraftContext, h: torch.Tensor) -> Proposal:
        with ctx.timer.span("forward"):
            logits = self.model.base_logits(h, compact=True)  # [R, G, N], head space
        head, (rows, size) = self.model.draft_head, logits.shape[:2]
        u = ctx.draft_uniforms(size, h.device)
        with ctx.timer.span("sample"):
            q = head.law_buffer(rows, size, device=logits.device, scratch=ctx.scratch)  # [R, G, V]
            tokens = head.draw(logits, ctx.sampling, u, q)  # [R, G], one batched draw
        return Proposal(tokens, torch.full((rows,), size, dtype=torch.long), q)

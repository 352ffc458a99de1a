"""``mtp``: a DeepSeek-V3-style multi-token-prediction module used as a drafter (reference section 5).

Model: ``h'_t = W_eh [RMSNorm_e(Emb(y_{t+1})); RMSNorm_h(z_t)]`` (Linear(2d -> d), no bias; embedding first,
with DeepSeek-V3's names ``enorm``/``hnorm``/``eh_proj``), where ``z_t`` is the target's final hidden state
after its last norm (``Features.final``); one pre-norm decoder block with causal self-attention over the MTP
module's own history (its own KV cache, as in DeepSeek-V3); final RMSNorm; the frozen target LM head. The output
at position t predicts y_{t+2}.

Inference reuses Eagle3's chain drafting (:class:`~dspark_bench.drafters.chain.ChainDrafter`): the cache holds
pairs (z_t, y_{t+1}); the first draft token comes from the output at the last committed position. **MTP-1**
(``depth=1``, the paper's production baseline) proposes that one token per round. ``depth=k`` chains the same
module k times ("MTP-k", static): draft j+1 is predicted from the pair (own output hidden of step j, x_j) at the
next position, i.e. the module's un-normed block output stands in for the target's z (which does not exist yet),
as vLLM/SGLang do when reusing one MTP layer. A round proposes min(depth, ctx.block_size) tokens.

Training (:meth:`MTPModel.loss`) is step 0 only: cross-entropy of y_{t+2} from (z_t, y_{t+1}).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from dspark_bench.drafters import vocab
from dspark_bench.drafters.base import DraftContext
from dspark_bench.drafters.chain import (
    ChainDrafter,
    ChainModel,
    checkpoint_folder,
    fresh,
    masked_mean,
    shift_left,
    soft_cross_entropy,
    ttt_mask,
    tv_acceptance,
)
from dspark_bench.drafters.layers import KV, DecoderLayer, LayerSpec, Linear, RMSNorm
from dspark_bench.drafters.registry import DrafterError, register

if TYPE_CHECKING:
    from dspark_bench.drafters.types import LossOutput, TrainBatch
    from dspark_bench.target.model import Target


class MTPModel(ChainModel):
    method = "mtp"

    def __init__(self, spec: LayerSpec, target: Target):
        super().__init__(spec, target)
        d = spec.hidden_size
        self.enorm = RMSNorm(d, spec.rms_norm_eps)
        self.hnorm = RMSNorm(d, spec.rms_norm_eps)
        self.eh_proj = Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(spec)])

    def context(self, layers: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        return final.to(self.eh_proj.weight.dtype)  # z_t, the target's final (post-norm) hidden state

    def forward(
        self,
        hidden: torch.Tensor,  # [B, L, d] z_t (or the module's own output hidden when chaining)
        tokens: torch.Tensor,  # [B, L] y_{t+1}
        positions: torch.Tensor,  # [B, L] RoPE positions (t)
        past: KV | None,  # [B, n_kv, C, hd] each
        mask: torch.Tensor,  # [B, L, C+L] bool
    ) -> tuple[torch.Tensor, KV]:
        x = self.eh_proj(torch.cat([self.enorm(self.embed(tokens)), self.hnorm(hidden)], dim=-1))
        return self.layers[0](x, None, positions, past, mask)

    def loss(self, batch: TrainBatch, generator: torch.Generator | None = None, soft: bool = False) -> LossOutput:
        """Mean cross-entropy of y_{t+2} over positions where y_{t+2} is a response token (``generator``
        unused). ``soft=True``: soft cross-entropy against the target law pi_{t+1} instead of the token.
        Acceptance: [1], alpha* = 1 - TV(q_t, pi_{t+1}) averaged over every position where y_{t+2} is a response
        token (the hard CE leaves out those outside the draft vocabulary; the acceptance keeps them)."""
        from dspark_bench.drafters.types import LossOutput

        b, n = batch.input_ids.shape
        positions = torch.arange(n, device=batch.input_ids.device).expand(b, n)
        hidden = self.context(batch.layers, batch.final)
        out, _ = self(hidden, shift_left(batch.input_ids, 1), positions, None, ttt_mask(batch.attention, 0))
        # over the draft vocabulary (vocab.py): pi restricted and renormalised, hard labels outside it dropped
        logits, pi = self.logits(out, compact=True), shift_left(self.target_probs(batch.final), 1)  # [B, n, N] each
        response = shift_left(batch.loss_mask, 2).float()
        labels, inside = self.draft_head.labels(shift_left(batch.input_ids, 2))
        if soft:
            ce, valid = soft_cross_entropy(logits, pi), response
        else:
            ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            valid = response * inside
        loss = masked_mean(ce, valid)
        # every response slot, like the block drafters and Eagle3: a token outside the list is a slot drafting loses
        accept = masked_mean(tv_acceptance(torch.softmax(logits.detach(), -1), pi), response)
        return LossOutput(loss, {"loss": float(loss.detach()), "ce0": float(loss.detach())}, accept.reshape(1))


@register("mtp")
class MTPDrafter(ChainDrafter):
    @dataclass(frozen=True)
    class Config:
        checkpoint: str | None = None  # our format; None: shipped reference or random
        depth: int = 1  # draft tokens per round (MTP-k chains the module k times)
        intermediate_size: int | None = None  # random init only; None: the target's
        seed: int = 0  # random init only
        draft_vocab: str | None = None  # None: the checkpoint's list (full head without one); "full"; a `data vocab` file

    def __init__(self, config: Config, target: Target):
        if config.depth < 1:
            raise DrafterError(f"mtp depth must be >= 1, got {config.depth}")
        super().__init__(config, target)
        folder = checkpoint_folder(config.checkpoint, target, self.name)
        if folder is not None:
            model = MTPModel.load(folder, target)
        else:
            spec = LayerSpec.from_target(target, config.intermediate_size)
            model = fresh(MTPModel(spec, target), config.seed, self.name)
        vocab.choose(model, config.draft_vocab)
        self.model = model.to(device=target.device, dtype=target.dtype).eval()

    def max_steps(self, ctx: DraftContext) -> int:
        return min(self.config.depth, ctx.block_size)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        # MTP reads only Features.final. Target only returns features when some layer is tapped, so tap
        # layer 0 (its output is ignored); () would do once the target returns `final` without taps.
        return (0,)

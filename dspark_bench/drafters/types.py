"""Data types shared by the training pipeline and every trainable drafter."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainBatch:
    """B right-padded training sequences with their cached target features.

    input_ids: [B, n] long, prompt + target-generated response (padding holds any id).
    loss_mask: [B, n] bool, True on response (assistant) tokens.
    attention: [B, n] bool, True on real tokens (False on padding).
    layers: [B, n, n_taps, d] outputs of the tapped target layers, in the drafter's ``feature_layers`` order.
    final: [B, n, d] target final hidden state after its last norm (pi_t = softmax(W_out final_t) is the
        target's law for token t+1).
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    attention: torch.Tensor
    layers: torch.Tensor
    final: torch.Tensor

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(*(t.to(device) for t in (self.input_ids, self.loss_mask, self.attention, self.layers, self.final)))


@dataclass(frozen=True)
class LossOutput:
    """loss: differentiable scalar; terms: named scalar loss terms for logging;
    acceptance: [k] analytic per-position acceptance alpha*_k = 1 - TV(q_k, pi_k) averaged over valid slots
    (the expected survival of draft position k given the earlier ones survived, at temperature 1)."""

    loss: torch.Tensor
    terms: dict[str, float]
    acceptance: torch.Tensor

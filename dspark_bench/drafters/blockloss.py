"""Training math shared by the block drafters (reference section 1.6): pure functions over tensors.

For a sequence y with loss mask m, an **anchor** p is a position with m_p = m_{p+1} = 1. Its block predicts
y_{p+1..p+G}. Draft position k (1..G) has

* label ``y_{p+k}`` and previous token ``x_{k-1} = y_{p+k-1}`` (teacher forcing; ``x_0`` is the anchor);
* validity ``v_k = prod_{j<=k} [p+j < n and m_{p+j}]`` (the contiguous valid prefix);
* weight ``w_k = v_k * exp(-(k-1)/gamma_w)``;
* target law ``pi_k = softmax(W_out z_{p+k-1})`` (fp32, no gradient);
* analytic acceptance ``alpha*_k = clamp(1 - 1/2 ||q_k - pi_k||_1, 0, 1)``, the probability that speculative
  sampling at temperature 1 accepts a token drawn from q_k.

Every loss term is a weighted mean ``sum(w * term) / sum(w)`` over all slots of the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class BlockTargets:
    """Teacher-forcing data for N anchors per sequence, G slots each.

    anchors: [B, N] anchor positions (0 for dummy blocks); labels/prev: [B, N, G] y_{p+k}, y_{p+k-1};
    validity: [B, N, G] bool v_k (False everywhere in dummy blocks); prev_index: [B, N, G] p+k-1 clamped to n-1.
    """

    anchors: torch.Tensor
    labels: torch.Tensor
    prev: torch.Tensor
    validity: torch.Tensor
    prev_index: torch.Tensor


def sample_anchors(mask: torch.Tensor, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` anchors per row of mask [B, n] (bool), uniformly without replacement among positions p
    with mask[p] and mask[p+1], sorted ascending. Returns anchors [B, N] and keep [B, N] (False = dummy block,
    anchor 0), N = max(1, min(count, most valid anchors in a row))."""
    valid = torch.zeros(mask.shape, dtype=torch.bool)
    valid[:, :-1] = (mask[:, :-1] & mask[:, 1:]).cpu()
    return sample_positions(valid, count, generator, mask.device)


def sample_positions(valid: torch.Tensor, count: int, generator: torch.Generator,
                     device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` positions per row where valid [B, n] (bool, CPU) is True, uniformly without replacement,
    sorted ascending: positions [B, N] and keep [B, N] (False = dummy, position 0), N as in :func:`sample_anchors`."""
    b, n = valid.shape
    device = valid.device if device is None else device
    width = max(1, min(count, int(valid.sum(1).max())))
    keys = torch.rand(b, n, generator=generator).masked_fill(~valid, 2.0)  # invalid positions sort last
    order = keys.argsort(dim=1)[:, :width]
    keep = valid.gather(1, order)
    key = torch.where(keep, order, n + torch.arange(width))  # dummies after the real anchors
    key = key.sort(dim=1).values
    keep = key < n
    return torch.where(keep, key, 0).to(device), keep.to(device)


def block_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor,
                  size: int) -> BlockTargets:
    """Labels, previous tokens and validity for anchors [B, N] of input_ids/loss_mask [B, n], G = size."""
    n = input_ids.shape[1]
    prev_idx = anchors.unsqueeze(-1) + torch.arange(size, device=anchors.device)  # p+k-1, k = 1..G
    label_idx = prev_idx + 1

    def at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # t [B, n], idx [B, N, G]
        return t.gather(1, idx.clamp_max(n - 1).flatten(1)).view(idx.shape)

    step_ok = (label_idx < n) & at(loss_mask.bool(), label_idx)
    validity = step_ok.long().cumprod(-1).bool() & keep.unsqueeze(-1)
    return BlockTargets(anchors, at(input_ids, label_idx), at(input_ids, prev_idx), validity,
                        prev_idx.clamp_max(n - 1))


def position_weights(validity: torch.Tensor, decay_gamma: float) -> torch.Tensor:
    """w_k = v_k exp(-(k-1)/gamma_w) for validity [..., G]; float32 [..., G]."""
    if not (decay_gamma > 0 and math.isfinite(decay_gamma)):
        raise ValueError(f"decay_gamma must be a positive number, got {decay_gamma}")
    k = torch.arange(validity.shape[-1], device=validity.device, dtype=torch.float32)
    return validity.float() * torch.exp(-k / decay_gamma)


def weighted_mean(term: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum(w * term) / sum(w) over all entries; slots with w = 0 never contribute (not even a NaN)."""
    term = torch.where(weights > 0, term, torch.zeros((), dtype=term.dtype, device=term.device))
    return (term * weights).sum() / weights.sum().clamp_min(1e-12)


def tv_l1(q: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """||q - pi||_1 over the last axis (= 2 TV): [..., V] x [..., V] -> [...] (inside ``vocab.exact_target_law``
    plus the target's mass outside the draft vocabulary, where q is zero)."""
    from dspark_bench.drafters.vocab import missing_mass

    return (q - pi).abs().sum(-1) + missing_mass(pi)


def analytic_acceptance(l1: torch.Tensor) -> torch.Tensor:
    """alpha* = clamp(1 - l1/2, 0, 1), detached (a training target, never a path for gradients)."""
    return (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[label], unreduced: [..., V] x [...] -> [...] (fp32)."""
    logq = F.log_softmax(logits.float(), dim=-1)
    return -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def acceptance_by_position(alpha: torch.Tensor, validity: torch.Tensor) -> torch.Tensor:
    """Mean alpha*_k over the valid slots at each position: [..., G] x [..., G] -> [G]."""
    v = validity.float().flatten(0, -2)
    a = torch.where(validity, alpha, torch.zeros_like(alpha)).flatten(0, -2)
    return (a * v).sum(0) / v.sum(0).clamp_min(1.0)

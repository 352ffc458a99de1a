"""Small building blocks shared by the single-layer chain drafters (Eagle3, MTP).

* :class:`LayerSpec`: the architecture of one Llama/Qwen3-style decoder layer, read off a HF-style config.
* :class:`RMSNorm`, :func:`rope`, :class:`Attention`, :class:`MLP`, :class:`DecoderLayer`: the layer itself,
  numerically the same as HF's Llama/Qwen3 layers (RMSNorm in fp32, ``rotate_half`` RoPE, per-head q/k norm
  before RoPE for Qwen3, grouped-query attention). Parameter names follow HF (``self_attn.q_proj`` ...), so
  DeepSeek's Eagle3 checkpoints load by name.
* :func:`stack_left` / :func:`attention_mask`: batching per-request KV caches of different lengths.

The layer does not own a cache: :meth:`DecoderLayer.forward` takes the past keys/values and a boolean mask and
returns the new keys/values, so callers decide what to keep (inference caches, training-time-test steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, n_kv, C, head_dim] each (after k-norm and RoPE)
_ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


@dataclass(frozen=True)
class LayerSpec:
    """Architecture of one decoder layer (sizes as in the HF config of the target)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    attention_bias: bool = False
    hidden_act: str = "silu"

    @staticmethod
    def from_target(target: Any, intermediate_size: int | None = None) -> LayerSpec:
        """A layer shaped like ``target``'s (q/k norm also when its layers have one)."""
        spec = LayerSpec.from_config(target.config, intermediate_size)
        qk_norm = spec.qk_norm or hasattr(target.model.model.layers[0].self_attn, "q_norm")
        return dataclasses.replace(spec, qk_norm=qk_norm)

    @staticmethod
    def from_config(config: Any, intermediate_size: int | None = None) -> LayerSpec:
        """Read the layer architecture off a HF config object or a config.json dict."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        heads = int(get("num_attention_heads"))
        return LayerSpec(
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(intermediate_size or get("intermediate_size")),
            num_heads=heads,
            num_kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or int(get("hidden_size")) // heads),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta(get("rope_parameters"), get("rope_theta")),
            qk_norm=str(get("model_type", "")).startswith("qwen3"),
            attention_bias=bool(get("attention_bias", False)),
            hidden_act=str(get("hidden_act", "silu")),
        )


def rope_theta(parameters: dict | None, theta: float | None) -> float:
    """RoPE base from ``rope_parameters`` (transformers 5) or ``rope_theta`` (older); only plain RoPE."""
    if parameters:
        if "full_attention" in parameters:  # per-layer-type dict (Gemma-style)
            parameters = parameters["full_attention"]
        kind = parameters.get("rope_type", "default")
        if kind != "default":
            raise ValueError(f"rope_type {kind!r} is not supported by the draft layers (only 'default')")
        return float(parameters["rope_theta"])
    if theta is None:
        raise ValueError("config has neither rope_parameters nor rope_theta")
    return float(theta)


class Linear(nn.Linear):
    """nn.Linear initialised to zeros instead of from the global RNG (see :func:`init_weights`)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ([B, 1, L, head_dim]) for absolute ``positions`` ([B, L])."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [B, L, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x: [B, H, L, hd]
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query self-attention whose Q/K/V read an input of width ``in_dim`` (d, or 2d for Eagle3)."""

    def __init__(self, spec: LayerSpec, in_dim: int):
        super().__init__()
        self.spec = spec
        h, kv, hd, bias = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.attention_bias
        self.q_proj = Linear(in_dim, h * hd, bias=bias)
        self.k_proj = Linear(in_dim, kv * hd, bias=bias)
        self.v_proj = Linear(in_dim, kv * hd, bias=bias)
        self.o_proj = Linear(h * hd, spec.hidden_size, bias=bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
            self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, L, in_dim]
        positions: torch.Tensor,  # [B, L]
        past: KV | None,  # [B, n_kv, C, hd] each
        mask: torch.Tensor,  # [B, L, C+L] bool, True = may attend
    ) -> tuple[torch.Tensor, KV]:
        b, n, _ = x.shape
        hd = self.spec.head_dim
        q = self.q_proj(x).view(b, n, -1, hd)
        k = self.k_proj(x).view(b, n, -1, hd)
        v = self.v_proj(x).view(b, n, -1, hd).transpose(1, 2)
        if self.spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope(positions, hd, self.spec.rope_theta, x.dtype)
        q, k = _rotate(q.transpose(1, 2), cos, sin), _rotate(k.transpose(1, 2), cos, sin)
        keys = k if past is None else torch.cat([past[0], k], dim=2)
        values = v if past is None else torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.unsqueeze(1), enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, spec: LayerSpec):
        super().__init__()
        if spec.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {spec.hidden_act!r} not supported; accepted: {', '.join(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.gate_proj = Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer. Plain (``fused=False``): ``h = x + attn(norm_in(x))``. Fused (Eagle3):
    ``u = [norm_in(x); hidden_norm(g)]`` (width 2d) feeds Q/K/V and the residual is the raw ``g``.
    Both then add ``mlp(post_attention_layernorm(h))``."""

    def __init__(self, spec: LayerSpec, fused: bool = False):
        super().__init__()
        d = spec.hidden_size
        self.input_layernorm = RMSNorm(d, spec.rms_norm_eps)
        if fused:
            self.hidden_norm = RMSNorm(d, spec.rms_norm_eps)
        self.self_attn = Attention(spec, 2 * d if fused else d)
        self.post_attention_layernorm = RMSNorm(d, spec.rms_norm_eps)
        self.mlp = MLP(spec)
        self.fused = fused

    def forward(
        self,
        x: torch.Tensor,  # [B, L, d] (the token embedding when fused)
        hidden: torch.Tensor | None,  # [B, L, d] recurrent hidden (fused only)
        positions: torch.Tensor,  # [B, L]
        past: KV | None,
        mask: torch.Tensor,  # [B, L, C+L] bool
    ) -> tuple[torch.Tensor, KV]:
        if self.fused:
            u, residual = torch.cat([self.input_layernorm(x), self.hidden_norm(hidden)], dim=-1), hidden
        else:
            u, residual = self.input_layernorm(x), x
        attn, kv = self.self_attn(u, positions, past, mask)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), kv


def init_weights(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic init without touching the global RNG: Linear ~ N(0, std), biases 0, norms 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def stack_left(caches: list[KV | None], like: torch.Tensor) -> tuple[KV, torch.Tensor]:
    """Left-pad per-request caches (each [n_kv, C_r, hd], or None = empty) into one batch.

    Returns ((keys, values) [R, n_kv, C, hd], valid [R, C] bool). ``like`` ([n_kv, 0, hd]) gives the
    shape/dtype/device used for empty caches.
    """
    width = max((0 if c is None else c[0].shape[1]) for c in caches)
    keys = like.new_zeros(len(caches), like.shape[0], width, like.shape[2])
    values = keys.clone()
    valid = torch.zeros(len(caches), width, dtype=torch.bool, device=like.device)
    for r, c in enumerate(caches):
        if c is not None and c[0].shape[1]:
            n = c[0].shape[1]
            keys[r, :, width - n :], values[r, :, width - n :] = c
            valid[r, width - n :] = True
    return (keys, values), valid


def attention_mask(valid: torch.Tensor, length: int) -> torch.Tensor:
    """[R, L, C+L] mask for L new causal positions after past columns ``valid`` ([R, C])."""
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    past = valid.unsqueeze(1).expand(-1, length, -1)
    return torch.cat([past, causal.expand(valid.shape[0], -1, -1)], dim=-1)

"""The parallel block backbone shared by DSpark and DFlash (reference sections 1.1-1.3 and 2.1).

Terms used below:

* **context**: the target features of committed positions ``0..p-1``. The outputs of the tapped target layers
  (``taps``) are concatenated and fused, ``c_t = RMSNorm(W_fc [a^{l1}_t; ...; a^{ln}_t])``. Every draft layer
  projects ``c_t`` with its own K (k-normed for Qwen3, RoPE at position t) and V projections and prepends them to
  the block's keys and values (**KV injection**); ``c_t`` itself never flows through the layers.
* **block**: the anchor ``y_p`` (the current token, whose target features do not exist yet) followed by G-1
  mask slots, at RoPE positions ``p..p+G-1``. Slot j predicts the token at ``p+j+1``, so the anchor slot is the
  first prediction. Slots attend to each other bidirectionally and to the context strictly before the anchor.
* **h**: the final-normed block outputs; the target's frozen LM head turns them into the base logits ``U``.

Layers are shaped like the target's (hidden size, heads, KV heads, head dim, MLP width, activation, norm eps);
Qwen3-style targets get per-head q/k RMSNorm. The frozen parts (input embedding, LM head, rotary tables) are
used straight from the target and never copied into a checkpoint.

Mask token. DeepSeek's Qwen3 drafts embed the mask slots with an unused row of the frozen target embedding
(``mask_token_id`` 151669, past the tokenizer's entries). SmolLM2's 49,152 rows are all real tokens, so reusing
one would make a mask slot look exactly like that token. With ``mask_token_id = None`` (our default) the drafter
therefore owns a learned ``mask_embedding`` vector [d] (d parameters, saved in its checkpoint); an integer
``mask_token_id`` selects a frozen target row instead, which is what DeepSeek's checkpoints use.

Default taps: ``min(5, L_T - 2)`` layers evenly spaced over ``1..L_T-2``, e.g. (1, 8, 15, 21, 28) for SmolLM2's
30 layers and (1, 2, 3, 4) for a 6-layer test target (DeepSeek's configs use [1, 9, 17, 25, 33] for 36 layers;
their checkpoints carry their own taps). The last layer is never tapped: its HF hidden state is post-norm.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dspark_bench.drafters import vocab
from dspark_bench.drafters.blockloss import BlockTargets, block_targets, sample_anchors

if TYPE_CHECKING:
    from dspark_bench.drafters.types import TrainBatch
    from dspark_bench.target.model import Target

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
INIT_STD = 0.02  # HF default initialiser, as in the reference


class ArchError(ValueError):
    """A drafter architecture that is malformed or does not fit the target."""


@dataclass(frozen=True)
class Arch:
    """Everything that fixes the shapes of a block drafter; stored as its checkpoint's config."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    attention_bias: bool
    qk_norm: bool
    vocab_size: int
    num_layers: int
    taps: tuple[int, ...]
    block_size: int  # G used in training (inference proposes the engine's block size)
    mask_token_id: int | None = None  # None: learned ``mask_embedding``
    markov_rank: int = 0  # 0: no Markov head (DFlash)
    markov_head_type: str = "vanilla"
    confidence_head: bool = False
    confidence_with_markov: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "taps": list(self.taps)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Arch:
        fields = dataclasses.fields(Arch)
        names = {f.name for f in fields}
        required = {f.name for f in fields if f.default is dataclasses.MISSING}
        unknown, missing = sorted(set(d) - names), sorted(required - set(d))
        if unknown or missing:
            raise ArchError(f"architecture config has unknown keys {unknown} / lacks keys {missing}")
        return Arch(**{**d, "taps": tuple(d["taps"])})

    def check(self, target: Target) -> None:
        """Fail early, and say why, when this draft cannot run on ``target``."""
        problems = []
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab size {self.vocab_size} != target's {target.vocab_size}")
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden size {self.hidden_size} != target's {target.hidden_size}")
        bad = [t for t in self.taps if not -1 <= t <= target.num_layers - 2]
        if bad or not self.taps:
            problems.append(f"tapped layers {list(self.taps)} must be non-empty, -1 (the embedding output) or within "
                            f"0..{target.num_layers - 2} (the last target layer {target.num_layers - 1} is forbidden)")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} outside the target vocab 0..{target.vocab_size - 1}")
        if self.markov_rank and self.markov_head_type not in MARKOV_HEAD_TYPES:
            problems.append(f"markov_head_type {self.markov_head_type!r} not in {MARKOV_HEAD_TYPES}")
        if self.num_layers < 1 or self.block_size < 1:
            problems.append(f"num_layers ({self.num_layers}) and block_size ({self.block_size}) must be >= 1")
        if problems:
            raise ArchError("drafter does not fit the target: " + "; ".join(problems))


def default_taps(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """``min(count, L-2)`` decoder layers evenly spaced over 1..L-2 (never the last layer L-1)."""
    hi = num_layers - 2
    if hi < 1:
        raise ArchError(f"a target with {num_layers} layers has no layer to tap in 1..L-2")
    n = min(count, hi)
    if n == 1:
        return (1,)
    return tuple(1 + (i * (hi - 1) + (n - 1) // 2) // (n - 1) for i in range(n))


def target_arch(target: Target, **fields: Any) -> Arch:
    """An architecture whose layers copy ``target``'s shapes; ``fields`` set the drafter-specific ones."""
    c = target.config
    heads = int(c.num_attention_heads)
    qk_norm = str(getattr(c, "model_type", "")).startswith("qwen3") or hasattr(
        target.model.model.layers[0].self_attn, "q_norm")
    return Arch(
        hidden_size=target.hidden_size, num_heads=heads, num_kv_heads=int(getattr(c, "num_key_value_heads", heads)),
        head_dim=int(getattr(c, "head_dim", None) or target.hidden_size // heads),
        intermediate_size=int(c.intermediate_size), rms_norm_eps=float(c.rms_norm_eps),
        hidden_act=str(getattr(c, "hidden_act", "silu")), attention_bias=bool(getattr(c, "attention_bias", False)),
        qk_norm=qk_norm, vocab_size=target.vocab_size, **fields,
    )


def shipped(method: str, target: Target, root: Path | None = None) -> Path | None:
    """The reference checkpoint shipped in ``dspark_bench/drafters/shipped/<target>/<method>/``, if there is one."""
    from dspark_bench.drafters.checkpoint import shipped_folder

    return shipped_folder(target.name, method, root)


# ---- layers ------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [B, H, L, hd] with cos/sin [B, L, hd] (HF's rotate-half convention)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        d, hd, bias = a.hidden_size, a.head_dim, a.attention_bias
        self.head_dim = hd
        self.q_proj = nn.Linear(d, a.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, a.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, a.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(a.num_heads * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, a.rms_norm_eps) if a.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hd, a.rms_norm_eps) if a.qk_norm else nn.Identity()

    def _heads(self, y: torch.Tensor) -> torch.Tensor:  # [B, L, n*hd] -> [B, n, L, hd]
        return y.view(*y.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def keys_values(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V [B, n_kv, L, hd] of x [B, L, d]; also the context injection."""
        k = rotate(self.k_norm(self._heads(self.k_proj(x))), cos, sin)
        return k, self._heads(self.v_proj(x))

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """x [B, Q, d]; ctx_k/ctx_v [B, n_kv, C, hd]; mask [B, Q, C+Q] bool or None (all visible)."""
        q = rotate(self.q_norm(self._heads(self.q_proj(x))), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else mask.unsqueeze(1), enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)
        self.act = ACT2FN[a.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """A pre-norm decoder layer (Llama / Qwen3) whose attention also reads the injected context K/V."""

    def __init__(self, a: Arch):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):  # x [B, Q, d] -> [B, Q, d]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


# ---- the backbone --------------------------------------------------------------------------------------------
class BlockDraftModel(nn.Module):
    """Context fusion + N draft layers + final norm. Parameter names follow DeepSeek's checkpoints."""

    def __init__(self, arch: Arch, target: Target):
        super().__init__()
        arch.check(target)
        if str(getattr(target.config, "model_type", "")).startswith("gemma"):
            raise ArchError("Gemma targets are not supported by the block drafters yet (Llama/Qwen-style only)")
        rotary = getattr(target.model.model, "rotary_emb", None)
        if rotary is None or rotary.inv_freq.numel() * 2 != arch.head_dim:
            raise ArchError(f"the draft's head_dim {arch.head_dim} must match the target's rotary tables")
        self.arch = arch
        self.target = target  # not a Module: the frozen embedding, LM head and RoPE are never saved
        d = arch.hidden_size
        self.fc = nn.Linear(len(arch.taps) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, arch.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(arch) for _ in range(arch.num_layers))
        self.norm = RMSNorm(d, arch.rms_norm_eps)
        if arch.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.zeros(d))
        vocab.install(self)  # draft_vocab buffer: None = the full head (see vocab.py)

    @classmethod
    def create(cls, arch: Arch, target: Target, state: dict[str, torch.Tensor] | None = None, seed: int = 0):
        """Build on the target's device and dtype: from ``state`` (strict, exact) or seeded random weights."""
        with torch.device("meta"):  # no allocation and no draw from the global RNG
            model = cls(arch, target)
        model.to_empty(device="cpu")
        if state is None:
            model.reset_parameters(seed)
        else:
            model.set_draft_vocab(state.get(vocab.STATE_KEY))  # a checkpoint's list sizes the buffer
            try:
                missing, unexpected = model.load_state_dict(state, strict=False)
            except RuntimeError as exc:  # shape mismatches
                raise ArchError(f"checkpoint weights do not fit the architecture: {exc}") from None
            if missing or unexpected:
                raise ArchError(f"checkpoint weights do not fit the architecture: missing {sorted(missing)}, "
                                f"unexpected {sorted(unexpected)}")
        return model.to(device=target.device, dtype=target.dtype).eval()

    def reset_parameters(self, seed: int) -> None:
        """Deterministic init: norms 1, biases 0, mask vector at the embedding's scale, the rest N(0, 0.02²)."""
        g = torch.Generator().manual_seed(seed)
        emb_std = float(self.target.model.get_input_embeddings().weight.float().std())
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    std = emb_std if name == "mask_embedding" else INIT_STD
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pos [B, L] -> cos, sin [B, L, hd]
        probe = torch.empty(0, dtype=self.dtype, device=pos.device)
        return self.target.model.model.rotary_emb(probe, pos)

    def context_kv(self, layers: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the injected K/V [B, n_kv, C, hd] of context features layers [B, C, n_taps, d]."""
        c = self.hidden_norm(self.fc(layers.to(self.dtype).flatten(-2)))
        cos, sin = self.rope(pos)
        return [layer.self_attn.keys_values(c, cos, sin) for layer in self.layers]

    def embed_block(self, anchors: torch.Tensor, size: int) -> torch.Tensor:
        """Block inputs [..., size, d] for anchor tokens [...]: the anchor, then size-1 mask slots."""
        emb = self.target.model.get_input_embeddings()
        first = emb(anchors).to(self.dtype)
        if self.arch.mask_token_id is None:
            mask = self.mask_embedding
        else:
            mask = emb(torch.tensor(self.arch.mask_token_id, device=anchors.device)).to(self.dtype)
        rest = mask.expand(*anchors.shape, size - 1, mask.shape[-1])
        return torch.cat([first.unsqueeze(-2), rest], dim=-2)

    def blocks(self, x, pos, kv, mask) -> torch.Tensor:
        """Final-normed h [B, Q, d] of block slots x [B, Q, d] at positions pos [B, Q]; kv from context_kv;
        mask [B, Q, C+Q] bool (None: everything visible)."""
        cos, sin = self.rope(pos)
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Draft over the token ids [N] only (None: the full vocabulary); see ``vocab.py``."""
        vocab.set_ids(self, ids)

    @property
    def draft_head(self) -> vocab.DraftHead:
        return vocab.head(self)

    def base_logits(self, h: torch.Tensor, compact: bool = False) -> torch.Tensor:
        """U = the target's frozen LM head on h [..., d], in float32 [..., V]; -inf outside the draft vocabulary
        (with ``compact``: [..., N] over it, the head space that :meth:`vocab.DraftHead.draw` samples in)."""
        return self.draft_head.sub_logits(h) if compact else self.draft_head.logits(h)

    def train_hidden(self, layers, input_ids, attention, anchors) -> torch.Tensor:
        """Training forward: h [B, N, G, d] for N anchors [B, N] per sequence, G = arch.block_size.

        layers [B, n, n_taps, d], input_ids [B, n], attention [B, n] bool. Each block sees the context strictly
        before its anchor and its own G slots (see :func:`training_mask`).
        """
        (b, n), size = input_ids.shape, self.arch.block_size
        kv = self.context_kv(layers, torch.arange(n, device=input_ids.device).expand(b, n))
        x = self.embed_block(input_ids.gather(1, anchors), size).flatten(1, 2)  # [B, N*G, d]
        pos = (anchors.unsqueeze(-1) + torch.arange(size, device=anchors.device)).flatten(1)
        h = self.blocks(x, pos, kv, training_mask(anchors, attention, size))
        return h.view(b, anchors.shape[1], size, -1)

    def train_view(self, batch: TrainBatch, generator: torch.Generator, num_anchors: int) -> TrainView:
        """1. sample anchors; 2. teacher-forcing targets; 3. block forward; 4. target laws pi (fp32, no grad)."""
        attention = batch.attention.bool()
        anchors, keep = sample_anchors(batch.loss_mask.bool() & attention, num_anchors, generator)
        t = block_targets(batch.input_ids, batch.loss_mask, anchors, keep, self.arch.block_size)
        layers = batch.layers.clone() if batch.layers.is_inference() else batch.layers  # autograd needs a plain one
        h = self.train_hidden(layers, batch.input_ids, attention, anchors)
        with torch.no_grad():
            idx = t.prev_index.flatten(1).unsqueeze(-1).expand(-1, -1, batch.final.shape[-1])
            z = batch.final.gather(1, idx).view(*t.prev_index.shape, -1)  # [B, N, G, d] = z_{p+k-1}
            pi = self.draft_head.target_law(z)  # restricted to the draft vocabulary and renormalised
        labels, inside = self.draft_head.labels(t.labels)
        return TrainView(h, t, pi, labels, inside)


@dataclass(frozen=True)
class TrainView:
    """One training forward: h [B, N, G, d] block outputs, the teacher-forcing targets, and in the draft head's
    space (N' = draft vocabulary size, V for the full head): pi [B, N, G, N'] the target law restricted to the
    draft vocabulary and renormalised, labels [B, N, G] the labels' indices there and in_vocab [B, N, G] bool
    (False: the label cannot be drafted; hard-label losses drop that slot)."""

    h: torch.Tensor
    targets: BlockTargets
    pi: torch.Tensor
    labels: torch.Tensor
    in_vocab: torch.Tensor


def training_mask(anchors: torch.Tensor, attention: torch.Tensor, size: int) -> torch.Tensor:
    """Visibility [B, N*G, n + N*G] for anchors [B, N] and attention [B, n]: slot (a, j) sees context t < p_a
    (real tokens only) and the G slots of its own block a, bidirectionally."""
    b, n = attention.shape
    t = torch.arange(n, device=anchors.device)
    ctx = (t < anchors.unsqueeze(-1)) & attention.unsqueeze(1)  # [B, N, n]
    ctx = ctx.repeat_interleave(size, dim=1)  # [B, N*G, n]
    block = torch.arange(anchors.shape[1] * size, device=anchors.device) // size
    own = (block.unsqueeze(1) == block.unsqueeze(0)).expand(b, -1, -1)  # [B, N*G, N*G]
    return torch.cat([ctx, own], dim=-1)

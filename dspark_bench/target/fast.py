"""A lean forward for Llama-family targets (Llama, Mistral, Qwen2, Qwen3), on the same batched cache as the Hugging
Face path.

Why: at SmolLM2-135M's size a decode step on the CPU is a few hundred small kernels, and transformers spends a
good part of it between them (module calls, output capture, mask building, three projections where one would do).
This module runs the same math as transformers' Llama with fewer and larger kernels, in the spirit of gpt-fast's
``model.py``:

- one matmul for Q, K and V and one for gate and up (the HF projections become views of the fused matrices, so
  no weight is held twice);
- RoPE read from a table built once (by the model's own rotary module: the same values, any static scaling),
  applied to the query and key heads together;
- attention by SDPA on the explicit mask :class:`~dspark_bench.target.model.Target` builds for a cache with holes
  (none where none is needed); in decode steps and verify blocks the query heads that share a KV head are packed
  into one head of ``G * L`` rows (no repeated K/V, see :func:`attention`); on the CPU a decode step's attention
  runs our own kernel instead (:mod:`dspark_bench.target.kernels`, handed in by Target), where it builds;
- a cache (:class:`KVCache`) that appends in place into spare columns instead of concatenating every layer every
  step;
- prompts prefilled end to end in one row (:meth:`FastForward.prefill`): every projection multiplies all their
  tokens at once, with no pads, and only attention runs prompt by prompt (what a production engine's variable-length
  prefill does);
- on the CPU, every projection and the LM head also held in oneDNN's packed layout (:class:`Linear`), read by the
  matmuls of up to :data:`PACK_MAX_ROWS` rows. torch's ``F.linear`` repacks the weight at every call above one row
  (a forward's matmuls took 2-2.5x as long through ``F.linear`` as packed at 8 and 32 rows, fp32, on a 2-vCPU Xeon;
  whole decode steps 1.5-1.6x), and at one row it runs the BLAS matrix-vector product (MKL in torch's CPU wheel),
  which on a 2-vCPU AMD EPYC with AVX-512 took twice as long as the packed product (fp32, SmolLM2-135M's matmuls of a
  forward at 1 / 2 / 3 rows: packed 0.51x / 0.26x / 0.19x ``F.linear``'s time; ``none`` at concurrency 1 ran 1.9x as
  fast, MTP-1, whose verify blocks are two tokens, 2.8x). Above the bound (long prefills) the repacking is paid back
  and ``F.linear``'s own kernel is the faster one again (on a 2-vCPU AMD EPYC with AVX2 only, SmolLM2-135M's four
  projections: packed 0.49x ``F.linear``'s time at 8 rows, 0.79x at 128, 0.99x at 512, 1.07x at 1,024, 1.12x at
  2,048). The packed copy is one more copy of the weights in memory.

transformers stays the loader and the reference: tests hold this path's logits, taps and greedy tokens to the HF
path's in fp32. :func:`arch_of` says which configs it runs; anything else runs on the HF path.

Cache layout (what Target's bookkeeping relies on, as with transformers' DynamicCache): ``layers[i].keys`` /
``.values`` are [R, Hkv, C, D] with a column per cache position, and ``crop(-n)`` drops the last n columns. Target
slices them, moves columns in place, or replaces them (drop, merge); an append notices when they no longer view
its buffer and makes a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark_bench.target import kernels

PACK_MAX_ROWS = 512  # matmuls of at most this many rows read the packed weight (Linear); longer ones (prefills) run
# F.linear, faster there (module docstring)
PACK_ROWS = 16  # blocks of at most this many queries pack their query heads (attention()); longer ones, prefills, do not
HEADROOM = 64  # spare columns a new cache buffer gets beyond what it must hold (a copy every 64 decode steps)
_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # static inverse frequencies: a table holds them


@dataclass(frozen=True)
class Arch:
    """What differs between the Llama-family models this path runs, decided once from the config. Llama, Mistral
    (without a sliding window) and Qwen2 are the same decoder here (Qwen2's Q/K/V biases are fused like any other
    bias); Qwen3 adds an RMSNorm over each query and key head before RoPE (``qk_norm``: two more weights in
    :class:`Layer`, read in :meth:`FastForward.block`). Gemma's (1 + w) norms, scaled embedding, GELU MLP and
    post-norms would be more flags; its sliding-window layers keep it on the HF path in any case (``full_causal``)."""

    family: str
    qk_norm: bool = False


FAMILIES = {"llama": Arch("llama"), "mistral": Arch("mistral"), "qwen2": Arch("qwen2"),
            "qwen3": Arch("qwen3", qk_norm=True)}  # model_type -> what this path runs for it


def arch_of(config) -> Arch | None:
    """The :class:`Arch` of a config this path runs exactly, else None (the HF path runs it). Full causal
    attention in every layer is the caller's check (``model.full_causal``)."""
    rope = getattr(config, "rope_parameters", None) or {}
    arch = FAMILIES.get(getattr(config, "model_type", None))
    if arch is None or getattr(config, "hidden_act", None) != "silu":
        return None
    if rope.get("rope_type", "default") not in _ROPE_TYPES:  # dynamic / longrope change with the sequence length
        return None
    return arch


def onednn_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :class:`Linear` packs weights of this dtype on this device: the CPU with oneDNN, fp32 or bf16 (oneDNN
    takes fp16 only on CPUs with native fp16), and a trial product that runs (it refuses bf16 on some CPUs)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        probe = torch.ones(8, 8, dtype=dtype)
        torch.ops.mkldnn._linear_pointwise(probe, torch.ops.mkldnn._reorder_linear_weight(probe, None), None,
                                           "none", [], "")
    except RuntimeError:
        return False
    return True


class Linear:
    """``x W^T + b`` for a weight [out, in] held twice: as it is (the model's parameter, which the HF modules and the
    drafters keep reading) and, where ``packed``, in oneDNN's blocked layout for any number of rows, made once.
    A product of at most :data:`PACK_MAX_ROWS` rows reads the packed copy; more rows run ``F.linear`` (the module
    docstring says why), and so does a product that autograd records (a drafter's training reads the target's head:
    oneDNN's packed product has no backward). Both compute the same product; their roundings differ, within the
    dtype's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool):
        self.weight, self.bias = weight, bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None) if packed else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows, recorded = x.numel() // x.shape[-1], x.requires_grad and torch.is_grad_enabled()
        if self.packed is None or recorded or rows > PACK_MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@dataclass(frozen=True)
class Layer:
    """One decoder layer's weights, fused. Shapes with d = hidden, D = head_dim, I = intermediate."""

    attn_norm: torch.Tensor  # [d]
    qkv: Linear  # [(Hq + 2 Hkv) D, d]
    o: Linear  # [d, Hq D]
    mlp_norm: torch.Tensor  # [d]
    gate_up: Linear  # [2 I, d]: gate rows, then up rows
    down: Linear  # [d, I]
    qk_norm: torch.Tensor | None = None  # [Hq + Hkv, D]: Qwen3's per-head query norm weight Hq times, key's Hkv times


class LayerKV:
    """One layer's K/V [R, Hkv, C, D]: views of a buffer with spare columns, appended to in place."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [R, Hkv, L, D] after the C columns held; returns the whole [R, Hkv, C + L, D]."""
        held = 0 if self.keys is None else self.keys.shape[2]
        if not self._fits(k, held + k.shape[2]):
            self._grow(k, held + k.shape[2] + HEADROOM)
        kb, vb = self._buffers
        kb[:, :, held : held + k.shape[2]] = k
        vb[:, :, held : held + k.shape[2]] = v
        self.keys, self.values = kb[:, :, : held + k.shape[2]], vb[:, :, : held + k.shape[2]]
        return self.keys, self.values

    def _fits(self, k: torch.Tensor, need: int) -> bool:
        """Whether ``keys``/``values`` still view the buffers (Target did not replace them) and ``need`` fits."""
        if self._buffers is None or self.keys is None:
            return False
        kb, vb = self._buffers
        return (need <= kb.shape[2] and kb.shape[:2] == k.shape[:2]
                and all(t.data_ptr() == b.data_ptr() and t.stride() == b.stride()
                        for t, b in ((self.keys, kb), (self.values, vb))))

    def _grow(self, k: torch.Tensor, columns: int) -> None:
        """New buffers of ``columns`` columns holding the current K/V (one copy, like one concatenation)."""
        rows, heads, _, dim = k.shape
        held = 0 if self.keys is None else self.keys.shape[2]
        kb, vb = k.new_empty(rows, heads, columns, dim), k.new_empty(rows, heads, columns, dim)
        if held:
            kb[:, :, :held], vb[:, :, :held] = self.keys, self.values
        self._buffers = (kb, vb)
        self.keys, self.values = kb[:, :, :held], vb[:, :, :held]


class KVCache:
    """Per-layer K/V in the layout Target's bookkeeping expects (module docstring)."""

    def __init__(self, num_layers: int):
        self.layers = [LayerKV() for _ in range(num_layers)]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``abs(tokens_to_remove)`` columns of every layer (DynamicCache's convention: negative)."""
        n = abs(tokens_to_remove)
        for layer in self.layers:
            if layer.keys is not None:
                keep = layer.keys.shape[2] - n
                layer.keys, layer.values = layer.keys[:, :, :keep], layer.values[:, :, :keep]


@dataclass(frozen=True)
class Attend:
    """How a block of L queries attends to the C + L cache columns. Target gives ``bias`` [R, 1, L, C + L] additive
    (0 / min) where the cache has holes or pads, or None with ``causal``: every column is valid and a query sees the
    columns up to its own. :meth:`FastForward.plan` turns that into what every layer uses: ``causal`` then means SDPA's
    own causal mask (a prefill, L = C + L), and ``packed`` that the query heads are packed, with ``bias`` repeated
    to [R or 1, 1, G L, C + L] (:func:`packed_bias`)."""

    bias: torch.Tensor | None
    causal: bool = False
    packed: bool = False


def fuse(*weights: torch.Tensor | None) -> torch.Tensor | None:
    """Concatenate projection weights (or biases) along the output dimension; None when they are absent."""
    return None if weights[0] is None else torch.cat(weights, dim=0)


def _share(linears, fused: torch.Tensor | None, name: str) -> None:
    """Make the HF projections' ``name`` views of the fused tensor, so the model keeps working on one copy."""
    if fused is None:
        return
    start = 0
    for linear in linears:
        n = getattr(linear, name).shape[0]
        setattr(linear, name, torch.nn.Parameter(fused[start : start + n], requires_grad=False))
        start += n


def fused_layer(layer, packed: bool, arch: Arch) -> Layer:
    """A :class:`Layer` from a transformers decoder layer of a family :func:`arch_of` names (whose projections then
    view it); ``packed``: its projections also held packed (:class:`Linear`)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
    wqkv, bqkv = fuse(*(m.weight for m in qkv)), fuse(*(m.bias for m in qkv))
    w13, b13 = fuse(*(m.weight for m in gate_up)), fuse(*(m.bias for m in gate_up))
    for linears, w, b in ((qkv, wqkv, bqkv), (gate_up, w13, b13)):
        _share(linears, w, "weight")
        _share(linears, b, "bias")
    qk_norm = None
    if arch.qk_norm:
        head_dim = attn.q_norm.weight.shape[0]
        heads = attn.q_proj.weight.shape[0] // head_dim, attn.k_proj.weight.shape[0] // head_dim
        qk_norm = torch.cat([attn.q_norm.weight.expand(heads[0], head_dim),
                             attn.k_norm.weight.expand(heads[1], head_dim)])
    return Layer(layer.input_layernorm.weight, Linear(wqkv, bqkv, packed),
                 Linear(attn.o_proj.weight, attn.o_proj.bias, packed), layer.post_attention_layernorm.weight,
                 Linear(w13, b13, packed), Linear(mlp.down_proj.weight, mlp.down_proj.bias, packed), qk_norm)


def rope_table(model, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [P, D] and sin [P, D] for positions 0..P-1 from the model's own rotary module (the values HF computes
    per forward), with sin's first half negated so that RoPE needs no ``rotate_half`` (:func:`rope`)."""
    rotary = model.model.rotary_emb
    probe = model.model.embed_tokens.weight[:1]  # only its dtype and device are read
    with torch.inference_mode():
        cos, sin = rotary(probe, torch.arange(length, device=probe.device).unsqueeze(0))  # [1, P, D]
    half = sin.shape[-1] // 2
    return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [..., d]
    """HF's Llama RMSNorm: normalise over the last dimension in fp32, round to the input dtype, then scale (one
    kernel in fp32, where the rounding is no rounding). ``weight`` [d], or [H, d] for x [..., H, d] where each head
    has its own row (Qwen3's query and key norms over the fused heads, :class:`Layer`'s ``qk_norm``)."""
    if x.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [R, L, H, D] rotated: x cos + rotate_half(x) sin, with rotate_half(x) sin = swap_halves(x) * sin' where
    sin' has its first half negated (exactly HF's values: negation commutes with rounding). cos, sin' [R, L, 1, D]."""
    r, n, h, d = x.shape
    swapped = x.view(r, n, h, 2, d // 2).flip(3).view(r, n, h, d)
    return x * cos + swapped * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: Attend, scale: float,
              decode: Callable | None = None) -> torch.Tensor:
    """q [R, L, Hq, D] against k, v [R, Hkv, S, D] -> [R, L, Hq D], as planned (:meth:`FastForward.plan`). Packed:
    the G = Hq / Hkv query heads of each KV head become one head of G L rows, so SDPA reads K/V once (for short
    blocks on the CPU, 1.2-15x faster than SDPA's grouped-query path with a mask, measured); else SDPA's
    grouped-query path. ``decode``: our CPU kernel (:func:`~dspark_bench.target.kernels.decode_attention`), which
    then runs the packed heads of a decode step (L = 1) instead of SDPA; longer blocks stay with SDPA, faster there
    (at 8 queries per row the kernel took 1.8-2.5x SDPA's time, ``baselines/kernels-vs-vllm/``)."""
    r, n, hq, d = q.shape
    hkv = k.shape[1]
    if not attend.packed:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=attend.bias, is_causal=attend.causal,
                                             scale=scale, enable_gqa=True)  # [R, Hq, L, D]
        return out.transpose(1, 2).reshape(r, n, hq * d)
    g = hq // hkv
    packed = q.view(r, n, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(r, hkv, g * n, d)  # [R, Hkv, G L, D]
    if decode is not None and n == 1:
        out = decode(packed.contiguous(), k, v, attend.bias, scale)  # a view of the fused QKV's rows when L = 1
    else:
        out = F.scaled_dot_product_attention(packed, k, v, attn_mask=attend.bias, scale=scale)  # [R, Hkv, G L, D]
    return out.view(r, hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(r, n, hq * d)


def causal_bias(width: int, columns: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, L, C + L] additive bias of L new columns after C valid ones: query i sees columns 0..C + i."""
    seen = torch.ones(width, columns + width, dtype=torch.bool, device=device).tril(columns)
    bias = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)
    return bias.view(1, 1, width, columns + width)


def packed_bias(bias: torch.Tensor | None, groups: int) -> torch.Tensor | None:
    """bias [R, 1, L, S] repeated for the G packed query heads: [R, 1, G L, S] (once per forward, not per layer)."""
    if bias is None or groups == 1:
        return bias
    r, _, n, s = bias.shape
    return bias.expand(r, groups, n, s).reshape(r, 1, groups * n, s)


class FastForward:
    """The decoder stack of a transformers model of a family :func:`arch_of` names, run lean (module docstring),
    and its LM head (``head``, which Target's ``lm_head`` calls). ``pack``: hold the weights packed too where oneDNN
    takes them (:class:`Linear`); ``kernel``: what gives our CPU attention kernel for decode steps
    (:func:`~dspark_bench.target.kernels.decode_attention` with its cache folder), called only where the kernel
    applies (the CPU, float32 or bfloat16, a head size a multiple of 16 up to 128) and used if it returns one. For
    the manifest: ``linear``, how the projections multiply (``onednn-packed`` or ``torch``), and ``attention``, what
    runs the attention (``cpu-decode-kernel``: ours in decode steps and SDPA elsewhere; ``sdpa``)."""

    def __init__(self, model, arch: Arch, pack: bool = True, kernel: Callable[[], Callable | None] | None = None):
        config = model.config
        self.arch = arch
        self.heads, self.kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.scale = self.head_dim**-0.5
        self.eps = float(config.rms_norm_eps)
        self.embed = model.model.embed_tokens.weight  # [V, d]
        self.final_norm = model.model.norm.weight  # [d]
        packed = pack and onednn_packs(self.embed.dtype, self.embed.device)
        self.linear = "onednn-packed" if packed else "torch"
        self.layers = [fused_layer(layer, packed, arch) for layer in model.model.layers]
        head = model.get_output_embeddings()
        self.head = Linear(head.weight, head.bias, packed)
        self.cos, self.sin = rope_table(model, int(config.max_position_embeddings))  # [P, D] each
        fits = kernels.applies(self.embed.device, self.embed.dtype, self.head_dim)
        self.decode = kernel() if kernel is not None and fits else None
        self.attention = "cpu-decode-kernel" if self.decode else "sdpa"

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def __call__(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                 taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids, positions [R, L] -> final hidden state [R, L, d] (after the last norm) and the tapped layers'
        outputs {layer: [R, L, d]} (-1: the embedding output), appending the block's K/V to ``cache``."""
        x = F.embedding(ids, self.embed)  # [R, L, d]
        cos, sin = self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)  # [R, L, 1, D]
        attend = self.plan(attend, cache, x.shape[1], x.dtype)
        wanted = set(taps)
        tapped = {-1: x} if -1 in wanted else {}
        for i, (layer, kv) in enumerate(zip(self.layers, cache.layers, strict=True)):
            x = self.block(layer, kv, x, cos, sin, attend)
            if i in wanted:
                tapped[i] = x
        return rms_norm(x, self.final_norm, self.eps), tapped

    def prefill(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, lengths: list[int],
                taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Prompts of ``lengths`` tokens laid end to end in one row (ids, positions [1, N], N their sum) into an
        empty ``cache``: what :meth:`__call__` returns, in that one row. Each prompt attends to itself alone, and
        its K/V lands in its own row of the cache from column 0 (R = ``len(lengths)`` rows, as many columns as the
        longest prompt; a shorter row holds zeros past its end, which Target's mask hides)."""
        x = F.embedding(ids, self.embed)  # [1, N, d]
        cos, sin = self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)  # [1, N, 1, D]
        starts = [sum(lengths[:r]) for r in range(len(lengths))]
        spans = list(zip(starts, lengths, strict=True))
        wanted = set(taps)
        tapped = {-1: x} if -1 in wanted else {}
        for i, (layer, kv) in enumerate(zip(self.layers, cache.layers, strict=True)):
            x = self.block(layer, kv, x, cos, sin, None, spans)
            if i in wanted:
                tapped[i] = x
        return rms_norm(x, self.final_norm, self.eps), tapped

    def plan(self, attend: Attend, cache: KVCache, width: int, dtype: torch.dtype) -> Attend:
        """What every layer of a forward of ``width`` new columns uses (:class:`Attend`), built once per forward."""
        held = 0 if cache.layers[0].keys is None else cache.layers[0].keys.shape[2]
        if attend.causal and held == 0:
            return Attend(None, causal=width > 1)  # a prefill without pads: SDPA's own causal mask
        if attend.causal and width == 1:
            return Attend(None, packed=True)  # one query that sees every column
        bias = causal_bias(width, held, dtype, self.embed.device) if attend.causal else attend.bias
        if width > PACK_ROWS:
            return Attend(bias)
        return Attend(packed_bias(bias, self.heads // self.kv_heads), packed=True)

    def block(self, w: Layer, kv: LayerKV, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              attend: Attend | None, spans: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """One decoder layer: x [R, L, d] -> [R, L, d]; with ``spans`` (:meth:`prefill`), R = 1 and the row holds
        the prompts (start, length) end to end."""
        r, n, _ = x.shape
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        qkv = w.qkv(rms_norm(x, w.attn_norm, self.eps)).view(r, n, hq + 2 * hkv, d)
        qk = qkv[:, :, : hq + hkv]
        if w.qk_norm is not None:
            qk = rms_norm(qk, w.qk_norm, self.eps)
        qk = rope(qk, cos, sin)  # [R, L, Hq + Hkv, D]
        if spans is None:
            k, v = kv.append(qk[:, :, hq:].transpose(1, 2), qkv[:, :, hq + hkv :].transpose(1, 2))  # [R, Hkv, S, D]
            x = x + w.o(attention(qk[:, :, :hq], k, v, attend, self.scale, self.decode))
        else:
            x = x + w.o(self.apart(kv, qk[:, :, :hq], qk[0, :, hq:], qkv[0, :, hq + hkv :], spans))
        gate, up = w.gate_up(rms_norm(x, w.mlp_norm, self.eps)).chunk(2, dim=-1)  # [R, L, I] each
        return x + w.down(F.silu(gate) * up)

    def apart(self, kv: LayerKV, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              spans: list[tuple[int, int]]) -> torch.Tensor:
        """Attention of prompts laid end to end, each over itself: q [1, N, Hq, D], k, v [N, Hkv, D] ->
        [1, N, Hq D]; each prompt's K/V copied into its own row of ``kv`` from column 0."""
        width = max(n for _, n in spans)
        keys = k.new_zeros(len(spans), self.kv_heads, width, self.head_dim)
        values = torch.zeros_like(keys)
        for r, (start, n) in enumerate(spans):
            keys[r, :, :n] = k[start : start + n].transpose(0, 1)
            values[r, :, :n] = v[start : start + n].transpose(0, 1)
        keys, values = kv.append(keys, values)
        causal = Attend(None, causal=True)
        return torch.cat([attention(q[:, start : start + n], keys[r : r + 1, :, :n], values[r : r + 1, :, :n], causal,
                                    self.scale) for r, (start, n) in enumerate(spans)], dim=1)

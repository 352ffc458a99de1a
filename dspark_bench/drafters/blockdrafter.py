"""The drafter half of DSpark and DFlash: per-request draft KV caches, the batched block forward, and where
the weights come from.

Each request keeps a :class:`ContextCache`: the injected K/V of every draft layer for its committed positions
``0..p-1`` (the positions whose target features the engine has delivered). A round (``propose``)

1. turns all requests' newly delivered features into K/V in one position-wise pass and appends them;
2. right-pads the R contexts to a common width (padding masked out) and runs the R blocks
   ``[current token, mask x (G-1)]`` at positions ``p..p+G-1`` through the layers at once;
3. hands the final-normed outputs h [R, G, d] to the method's ``draw`` (DFlash: independent sampling; DSpark:
   the sequential Markov head), which samples through the engine's one batched sampler (``ctx.sample``) with
   the requests' draft uniforms.

The prompt's features are turned into K/V in ``begin``, so that prompt processing is part of the prefill (TTFT)
for these drafters as for Eagle3 and MTP. Model compute is timed as the span "forward" (:mod:`..timing`).

Weights: ``config.checkpoint`` (one of our folders, a DeepSeek-format folder, or a hub id ``org/name`` that
is downloaded only because the user named it); otherwise the reference checkpoint shipped under
``dspark_bench/drafters/shipped/<target>/<method>/``; otherwise seeded random weights, with a warning.
"""

from __future__ import annotations

import logging
import re
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dspark_bench.drafters import checkpoint, deepseek, vocab
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal, Slot
from dspark_bench.drafters.blockdraft import (
    Arch,
    ArchError,
    BlockDraftModel,
    default_taps,
    shipped,
    target_arch,
)
from dspark_bench.drafters.registry import DrafterError
from dspark_bench.target.model import to_device

if TYPE_CHECKING:
    from dspark_bench.core.verify import Verdict
    from dspark_bench.target.model import Features, Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockConfig:
    """Options shared by DSpark and DFlash. Architecture fields apply only when no checkpoint is loaded."""

    checkpoint: str | None = None  # our folder, a DeepSeek-format folder, or a hub id 'org/name'
    num_layers: int = 1
    taps: tuple[int, ...] | None = None  # None: evenly spaced (blockdraft.default_taps); the CLI may pass "1,3,5"
    mask_token_id: int | None = None  # None: a learned mask embedding (see blockdraft's docstring)
    block_size: int = 7  # G in training; inference proposes the engine's block size
    seed: int = 0  # seed of the random initialisation
    perturb: float = 0.0  # degraded-drafter control: add N(0, (perturb * std of each weight tensor)^2), seeded
    draft_vocab: str | None = None  # None: the checkpoint's list (full head without one); "full"; a `data vocab` file


def perturb_weights(model: torch.nn.Module, scale: float, seed: int) -> None:
    """Add seeded Gaussian noise of ``scale`` x each floating tensor's own std to the drafter's trained weights
    (the frozen target is not part of the model's parameters). A deliberately degraded drafter for gate tests."""
    if not scale > 0:
        raise DrafterError(f"perturb must be a positive noise scale, got {scale}")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.is_floating_point() and p.numel() > 1:
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device)  # CPU generator
                p.add_((noise * scale * p.float().std()).to(p.dtype))


def parse_taps(taps: Any, num_layers: int) -> tuple[int, ...]:
    if taps is None:
        return default_taps(num_layers)
    try:
        if isinstance(taps, str):
            return tuple(int(t) for t in taps.replace(" ", "").split(",") if t)
        return tuple(int(t) for t in taps)
    except (TypeError, ValueError):
        raise DrafterError(f"taps must be layer ids like 1,3,5 (or None), got {taps!r}") from None


@dataclass(eq=False)
class ContextCache:
    """Injected context K/V [layers, n_kv, capacity, hd] of positions 0..length-1; ``pending``: features
    delivered by the engine and not yet turned into K/V."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    length: int = 0
    pending: list[Features] = field(default_factory=list)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:  # [layers, n_kv, n, hd] each
        n = k.shape[2]
        if self.keys is None or self.length + n > self.keys.shape[2]:
            capacity = max(2 * self.length, self.length + n, 64)
            keys, values = k.new_zeros(*k.shape[:2], capacity, k.shape[3]), v.new_zeros(*v.shape[:2], capacity, v.shape[3])
            if self.keys is not None:
                keys[:, :, : self.length] = self.keys[:, :, : self.length]
                values[:, :, : self.length] = self.values[:, :, : self.length]
            self.keys, self.values = keys, values
        self.keys[:, :, self.length : self.length + n] = k
        self.values[:, :, self.length : self.length + n] = v
        self.length += n


class BlockDrafter(Drafter):
    """Base of DSpark and DFlash. Subclasses set ``Model`` and implement ``arch_fields`` and ``draw``."""

    Model: ClassVar[type[BlockDraftModel]]

    def __init__(self, config: BlockConfig, target: Target):
        super().__init__(config, target)
        self.model = load_model(type(self).Model, self.name, config, target, self.arch_fields(config, target))
        vocab.choose(self.model, config.draft_vocab)
        if config.perturb:
            perturb_weights(self.model, config.perturb, config.seed)

    def arch_fields(self, config: BlockConfig, target: Target) -> dict[str, Any]:
        """Architecture fields of a freshly initialised drafter (used only without a checkpoint)."""
        if config.num_layers < 1 or config.block_size < 1:
            raise DrafterError(f"num_layers and block_size must be >= 1, got {config.num_layers}, {config.block_size}")
        return dict(num_layers=config.num_layers, taps=parse_taps(config.taps, target.num_layers),
                    block_size=config.block_size, mask_token_id=config.mask_token_id)

    @abstractmethod
    def draw(self, ctx: DraftContext, h: torch.Tensor) -> Proposal:
        """Sample the R blocks from the final-normed backbone outputs h [R, G, d]."""

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.model.arch.taps

    def begin(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:
        for s in slots:
            s.state = ContextCache()
            if s.new_features is not None:
                s.state.pending.append(s.new_features)
        with torch.inference_mode(), ctx.timer.span("forward"):
            self._ingest(slots)  # the prompt's context K/V now: prompt processing belongs to the prefill

    def commit(self, ctx: DraftContext, slots: Sequence[Slot], verdicts: Sequence[Verdict]) -> None:
        for s in slots:
            if s.new_features is not None:
                s.state.pending.append(s.new_features)

    def end(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:
        for s in slots:
            s.state = None

    def propose(self, ctx: DraftContext) -> Proposal:
        if not ctx.slots:
            return Proposal.empty(0)
        with torch.inference_mode():
            with ctx.timer.span("forward"):
                h = self.block_hidden(ctx)
            return self.draw(ctx, h)

    def block_hidden(self, ctx: DraftContext) -> torch.Tensor:
        """h [R, G, d] for the slots of ``ctx`` (G = ctx.block_size); updates their context caches."""
        slots, size, device = ctx.slots, ctx.block_size, self.model.fc.weight.device
        self._ingest(slots)
        kv, valid = self._context(slots)
        anchors, start = to_device([[s.tokens[-1], s.position] for s in slots], device).T
        pos = start.unsqueeze(1) + torch.arange(size, device=device)  # [R, G]
        mask = None
        if valid is not None:  # contexts of different lengths: hide the right padding
            ones = torch.ones(len(slots), size, size, dtype=torch.bool, device=device)
            mask = torch.cat([valid.unsqueeze(1).expand(-1, size, -1), ones], dim=-1)
        return self.model.blocks(self.model.embed_block(anchors, size), pos, kv, mask)

    def _ingest(self, slots: Sequence[Slot]) -> None:
        """Context K/V of every slot's pending features, computed in one position-wise pass."""
        feats, pos, counts = [], [], []
        for s in slots:
            start = s.state.length
            for f in s.state.pending:
                feats.append(f.layers)
                pos.extend(range(start, start + len(f)))
                start += len(f)
            counts.append(start - s.state.length)
            if start != s.position:
                raise RuntimeError(f"request {s.request_id}: draft context covers {start} positions but the "
                                   f"current token is at {s.position}; features were not delivered in order")
        if feats:
            device = self.model.fc.weight.device
            kv = self.model.context_kv(torch.cat(feats).to(device).unsqueeze(0), to_device(pos, device).unsqueeze(0))
            keys = torch.stack([k[0] for k, _ in kv])  # [layers, n_kv, N, hd]
            values = torch.stack([v[0] for _, v in kv])
            for s, k, v in zip(slots, keys.split(counts, dim=2), values.split(counts, dim=2), strict=True):
                if k.shape[2]:
                    s.state.append(k, v)
        for s in slots:
            s.state.pending.clear()

    def _context(self, slots: Sequence[Slot]):
        """Per layer (K, V) [R, n_kv, C, hd], right-padded, and valid [R, C] (None when nothing is padded)."""
        caches = [s.state for s in slots]
        width = max(c.length for c in caches)
        if len(caches) == 1:  # nothing to pad: views of the cache, no copy
            c = caches[0]
            return [(c.keys[i, None, :, :width], c.values[i, None, :, :width]) for i in range(len(c.keys))], None
        first = caches[0].keys
        keys = first.new_zeros(first.shape[0], len(caches), first.shape[1], width, first.shape[3])
        values = torch.zeros_like(keys)
        for r, c in enumerate(caches):
            keys[:, r, :, : c.length] = c.keys[:, :, : c.length]
            values[:, r, :, : c.length] = c.values[:, :, : c.length]
        kv = [(keys[i], values[i]) for i in range(len(keys))]
        if all(c.length == width for c in caches):
            return kv, None
        lengths = to_device([c.length for c in caches], keys.device)
        return kv, torch.arange(width, device=keys.device) < lengths.unsqueeze(1)

    def save(self, folder: str | Path) -> Path:
        """Write the trained weights (no frozen target copies) and the target fingerprint to ``folder``."""
        fingerprint = checkpoint.TargetFingerprint.of(self.target)
        return checkpoint.save(folder, self.name, self.model.arch.to_dict(), self.model.state_dict(), fingerprint)


# ---- where the weights come from -------------------------------------------------------------------------------
def load_model(model_cls: type[BlockDraftModel], method: str, config: BlockConfig, target: Target,
               fields: dict[str, Any]) -> BlockDraftModel:
    """The drafter's model: from the named checkpoint, else the shipped one, else seeded random weights."""
    path = resolve_checkpoint(config.checkpoint) if config.checkpoint else shipped(method, target)
    try:
        if path is None:
            log.warning("%s: no checkpoint given and none shipped for target %r: random weights (seed %d)",
                        method, target.name, config.seed)
            return model_cls.create(target_arch(target, **fields), target, seed=config.seed)
        if deepseek.is_deepseek(path):
            arch, state = deepseek.load_block_drafter(path, target, method)
        else:
            arch, state = load_ours(path, target, method)
        return model_cls.create(arch, target, state)
    except ArchError as exc:
        where = f" (checkpoint {path})" if path else ""
        raise DrafterError(f"{method}{where}: {exc}") from None


def load_ours(path: Path, target: Target, method: str) -> tuple[Arch, dict[str, torch.Tensor]]:
    meta, state = checkpoint.load(path)
    if meta.get("format") != checkpoint.FORMAT:
        raise checkpoint.CheckpointError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    if meta.get("method") != method:
        raise checkpoint.CheckpointError(f"{path} holds a {meta.get('method')!r} drafter, not {method!r}")
    checkpoint.check_target(meta, target)
    if not isinstance(meta.get("config"), dict):
        raise checkpoint.CheckpointError(f"{path / 'config.json'} has no 'config' object (the drafter's architecture)")
    return Arch.from_dict(meta["config"]), state


def resolve_checkpoint(spec: str) -> Path:
    """A local folder, or a hub id ``org/name`` downloaded with huggingface_hub (only when the user names it)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors"]))
    raise checkpoint.CheckpointError(f"checkpoint {spec!r} is neither a folder nor a hub id 'org/name'")

"""How each trainable method is built, fed and saved: the only place the trainer meets the drafter modules.

A :class:`Method` says, for one drafter name, how to build a freshly initialised trainable module for a target
(fp32 master weights on the target's device, seeded), which target layers its training batches must carry,
which keyword arguments its ``loss(batch, generator, **kwargs) -> LossOutput`` takes, and how to write the
checkpoint that ``--drafter-opt NAME.checkpoint=FOLDER`` loads. Training always starts from fresh weights: the
drafters' own constructors would pick up a shipped reference checkpoint, so the modules are built directly.

Sizes (:class:`MethodOptions`; each method uses the fields listed in ``Method.options``):

* ``dspark``/``dflash``: the block backbone of ``num_layers`` draft layers, block ``block_size`` (G),
  ``num_anchors`` anchors per sequence, position weights ``exp(-(k-1)/decay_gamma)``; DSpark adds the Markov head
  of rank ``markov_rank`` (``markov_head``: ``vanilla``, the paper's Markov head, or the ``gated``/``rnn``
  variants of Figure 4) and the confidence head.
* ``eagle3``: one fused decoder layer trained with a ``ttt_length``-step training-time test (weights 0.8^k),
  scored at ``num_anchors`` positions per sequence like the block drafters (same predictions per sequence).
* ``mtp``: the DeepSeek-V3-style MTP module, one step (MTP-1), cross-entropy of the sampled token.

``decay_gamma`` defaults to 4.0, DeepSeek's released configs (``loss_decay_gamma`` = 4 with G = 7), not the
paper's gamma = G: the checkpoints whose numbers we compare with (Table 1) were trained with 4, and it keeps
more weight on early positions (w_7 = e^-1.5 = 0.22 rather than e^-0.86 = 0.42), which carry the acceptance length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from dspark_bench.target.model import Target


@dataclass(frozen=True)
class MethodOptions:
    num_layers: int = 1
    markov_rank: int = 64
    block_size: int = 7
    num_anchors: int = 64
    decay_gamma: float = 4.0
    ttt_length: int = 7
    seed: int = 0
    taps: tuple[int, ...] | None = None  # None: blockdraft.default_taps (the same for every method)
    markov_head: str = "vanilla"  # dspark: vanilla (the paper's Markov head) | gated | rnn (Figure 4's RNN head)
    draft_vocab: int = 0  # every method: draft over the N most frequent response tokens (drafters/vocab.py); 0: all

    def __post_init__(self) -> None:
        small = [k for k in ("num_layers", "markov_rank", "block_size", "num_anchors", "ttt_length")
                 if getattr(self, k) < 1] + (["draft_vocab"] if self.draft_vocab < 0 else [])
        if small or not self.decay_gamma > 0:
            raise ValueError(f"method options {small or ['decay_gamma']} must be positive (draft_vocab: >= 0)")
        from dspark_bench.drafters.blockdraft import MARKOV_HEAD_TYPES

        if self.markov_head not in MARKOV_HEAD_TYPES:
            raise ValueError(f"markov head {self.markov_head!r} is not one of {', '.join(MARKOV_HEAD_TYPES)}")


@dataclass(frozen=True)
class Method:
    name: str
    options: tuple[str, ...]  # the MethodOptions fields this method uses (recorded with the run)
    build: Callable[[Target, MethodOptions], nn.Module]
    taps: Callable[[Target, MethodOptions], tuple[int, ...]]  # target layers the training batches carry
    loss_kwargs: Callable[[MethodOptions], dict[str, Any]]
    save: Callable[[nn.Module, Path], Path]

    def used(self, options: MethodOptions) -> dict[str, Any]:
        return {f.name: getattr(options, f.name) for f in fields(options) if f.name in self.options}


def _taps(target: Target, options: MethodOptions) -> tuple[int, ...]:
    from dspark_bench.drafters.blockdraft import default_taps

    return tuple(options.taps) if options.taps is not None else default_taps(target.num_layers)


def _fp32(module: nn.Module, target: Target) -> nn.Module:
    """fp32 master weights on the target's device (bf16 compute comes from autocast on CUDA)."""
    return module.to(device=target.device, dtype=torch.float32).train()


# ---- block drafters (dspark, dflash) ---------------------------------------------------------------------------
def _block_builder(module_path: str, class_name: str, markov: bool) -> Callable[[Target, MethodOptions], nn.Module]:
    def build(target: Target, o: MethodOptions) -> nn.Module:
        import importlib

        from dspark_bench.drafters.blockdraft import target_arch

        cls = getattr(importlib.import_module(module_path), class_name)
        heads = ({"markov_rank": o.markov_rank, "markov_head_type": o.markov_head, "confidence_head": True}
                 if markov else {"markov_rank": 0})
        arch = target_arch(target, num_layers=o.num_layers, taps=_taps(target, o), block_size=o.block_size,
                           mask_token_id=None, **heads)
        return _fp32(cls.create(arch, target, seed=o.seed), target)

    return build


def _save_block(name: str) -> Callable[[nn.Module, Path], Path]:
    def save(module: nn.Module, folder: Path) -> Path:  # what BlockDrafter.save writes
        from dspark_bench.drafters import checkpoint

        fingerprint = checkpoint.TargetFingerprint.of(module.target)
        return checkpoint.save(folder, name, module.arch.to_dict(), module.state_dict(), fingerprint)

    return save


def _block_loss(o: MethodOptions) -> dict[str, Any]:
    return {"num_anchors": o.num_anchors, "decay_gamma": o.decay_gamma}


# ---- chain drafters (eagle3, mtp) ------------------------------------------------------------------------------
def _build_eagle3(target: Target, o: MethodOptions) -> nn.Module:
    from dspark_bench.drafters.chain import Eagle3Model
    from dspark_bench.drafters.layers import LayerSpec, init_weights

    model = Eagle3Model(LayerSpec.from_target(target), _taps(target, o), target)
    init_weights(model, o.seed)
    return _fp32(model, target)


def _build_mtp(target: Target, o: MethodOptions) -> nn.Module:
    from dspark_bench.drafters.layers import LayerSpec, init_weights
    from dspark_bench.drafters.mtp import MTPModel

    model = MTPModel(LayerSpec.from_target(target), target)
    init_weights(model, o.seed)
    return _fp32(model, target)


def _save_chain(module: nn.Module, folder: Path) -> Path:
    return module.save(folder)


_BLOCK = ("num_layers", "block_size", "num_anchors", "decay_gamma", "seed", "taps", "draft_vocab")
METHODS: MappingProxyType[str, Method] = MappingProxyType({
    "dspark": Method("dspark", (*_BLOCK, "markov_rank", "markov_head"), _block_builder("dspark_bench.drafters.dspark", "DSparkModel", True),
                     _taps, _block_loss, _save_block("dspark")),
    "dflash": Method("dflash", _BLOCK, _block_builder("dspark_bench.drafters.dflash", "DFlashModel", False),
                     _taps, _block_loss, _save_block("dflash")),
    "eagle3": Method("eagle3", ("ttt_length", "num_anchors", "seed", "taps", "draft_vocab"), _build_eagle3, _taps,
                     lambda o: {"ttt_length": o.ttt_length, "num_anchors": o.num_anchors}, _save_chain),
    "mtp": Method("mtp", ("seed", "draft_vocab"), _build_mtp, lambda t, o: (), lambda o: {}, _save_chain),  # reads only final
})


def method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown training method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]

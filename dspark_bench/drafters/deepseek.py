"""Loading DeepSeek's released draft checkpoints (the DeepSpec format) into our classes.

Format (``/work/shared/reference/deepspec-checkpoint-format.md``): a folder with ``config.json`` (the target's
HF config plus draft keys; ``architectures`` names the draft class) and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), BF16, un-prefixed parameter names. The frozen ``embed_tokens`` and ``lm_head``
copies are stored too; we check that they are the target's (:func:`frozen_copy_matches`: compared in the
checkpoint's dtype, so a bf16 draft also loads on an fp16 target) and then use the target's own modules.

Organised per method: shared readers first, then one section per draft family.

* **DSpark / DFlash** (``Qwen3DSparkModel``; DFlash is the same class with ``markov_rank`` 0 and no confidence
  head): our :class:`~dspark_bench.drafters.blockdraft.BlockDraftModel` uses the same parameter names, so the
  state dict maps 1:1 once the frozen copies are removed.
* **Eagle3**: to be added.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_bench.drafters.blockdraft import Arch
from dspark_bench.drafters.checkpoint import CheckpointError, read_json, read_tensors

if TYPE_CHECKING:
    from dspark_bench.target.model import Target


# ---- shared -----------------------------------------------------------------------------------------------------
def is_deepseek(path: Path) -> bool:
    """True for a DeepSpec-format folder (its config.json names ``architectures``)."""
    config = Path(path) / "config.json"
    return config.is_file() and "architectures" in read_json(config)


def read_config(path: Path) -> dict[str, Any]:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    return read_json(file)


def weight_files(path: Path) -> list[Path]:
    """``model.safetensors``, or the shards named by ``model.safetensors.index.json`` (each must exist)."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        raise CheckpointError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index}: expected a 'weight_map' object of parameter name -> shard file name")
    files = [path / f for f in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{index} names shards that are not in {path}: {', '.join(missing)}")
    return files


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of :func:`weight_files`, the ``_orig_mod.`` prefix (torch.compile's) removed."""
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        state.update({k.removeprefix("_orig_mod."): v for k, v in read_tensors(f).items()})
    return state


def rope_settings(config: dict[str, Any]) -> tuple[float | None, str]:
    """(rope_theta, rope_type) from ``rope_parameters`` (transformers 5) or a top-level ``rope_theta``."""
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta"))
    return (None if theta is None else float(theta)), str(params.get("rope_type", "default"))


def _holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Every value of dtype ``narrow`` is exactly a value of ``wide`` (fp32 holds bf16 and fp16; bf16 and fp16
    do not hold each other: bf16 has the range, fp16 the precision)."""
    return wide == narrow or (torch.finfo(wide).bits > torch.finfo(narrow).bits and wide.is_floating_point)


def frozen_copy_matches(theirs: torch.Tensor, mine: torch.Tensor) -> bool:
    """Is the checkpoint's frozen copy ``theirs`` the target weight ``mine``, as far as the two dtypes can tell?

    Compared in the checkpoint's dtype. Where the target's dtype holds every value of the checkpoint's (the same
    dtype, or an fp32 target), the copy must be exact. A bf16 copy on an fp16 target (or the reverse) went through
    another rounding: each value may then differ by one rounding step of the coarser format (relative 2^-7, or
    2^-24 absolute at fp16's subnormals), which no copy of another target's weights meets."""
    if theirs.shape != mine.shape:
        return False
    mine = mine.detach().cpu()
    if torch.equal(theirs, mine.to(theirs.dtype)):
        return True
    if _holds(mine.dtype, theirs.dtype):
        return False
    rel = max(torch.finfo(theirs.dtype).eps, torch.finfo(mine.dtype).eps)
    a, b = theirs.double(), mine.double()
    return bool(((a - b).abs() <= rel * torch.maximum(a.abs(), b.abs()) + 2.0 ** -24).all())


def take_frozen_copies(state: dict[str, torch.Tensor], target: Target) -> None:
    """Remove ``embed_tokens``/``lm_head`` from ``state`` after checking they are the target's
    (:func:`frozen_copy_matches`)."""
    model = target.model
    for key, mine in (("embed_tokens.weight", model.get_input_embeddings().weight),
                      ("lm_head.weight", model.get_output_embeddings().weight)):
        theirs = state.pop(key, None)
        if theirs is None:
            raise CheckpointError(f"checkpoint has no {key} (DeepSpec checkpoints store the frozen target copies)")
        if not frozen_copy_matches(theirs, mine):
            raise CheckpointError(f"checkpoint's {key} {tuple(theirs.shape)} is not a copy of target "
                                  f"{target.name!r}'s: the drafter was trained for a different target")


def check_target_fit(config: dict[str, Any], target: Target) -> None:
    """Checks DeepSpec leaves implicit: depth and RoPE. (Taps are checked by the architecture: -1, the embedding
    output, is a valid tap.)"""
    problems = []
    depth = config.get("num_target_layers")
    if depth is not None and int(depth) != target.num_layers:
        problems.append(f"num_target_layers {depth} != the target's {target.num_layers} layers")
    theirs, mine = rope_settings(config), rope_settings(target.config.to_dict())
    if theirs[0] is not None and mine[0] is not None and (theirs[0] != mine[0] or theirs[1] != mine[1]):
        problems.append(f"RoPE (theta, type) {theirs} != the target's {mine}")
    if problems:
        raise CheckpointError("draft does not fit the target: " + "; ".join(problems))


# ---- DSpark / DFlash ----------------------------------------------------------------------------------------------
BLOCK_ARCHITECTURES = ("Qwen3DSparkModel",)
BLOCK_REQUIRED = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers",
                  "target_layer_ids", "mask_token_id", "block_size", "markov_rank", "enable_confidence_head")


def block_arch(config: dict[str, Any], method: str) -> Arch:
    """Our architecture for a ``Qwen3DSparkModel`` config; ``method`` ('dspark'/'dflash') must match it."""
    name = (config.get("architectures") or [None])[0]
    if name not in BLOCK_ARCHITECTURES:
        raise CheckpointError(f"architecture {name!r} is not a DSpark/DFlash draft this loader reads "
                              f"({', '.join(BLOCK_ARCHITECTURES)}; Gemma4 drafts are not supported)")
    missing = [k for k in BLOCK_REQUIRED if k not in config]
    if missing:
        raise CheckpointError(f"config.json lacks required keys {missing}")
    rank, confidence = int(config["markov_rank"]), bool(config["enable_confidence_head"])
    kind = "dspark" if rank > 0 else "dflash"
    if kind != method:
        raise CheckpointError(f"this is a {kind} checkpoint (markov_rank {rank}); load it with drafter {kind!r}, "
                              f"not {method!r}")
    heads, d = int(config["num_attention_heads"]), int(config["hidden_size"])
    return Arch(
        hidden_size=d, num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or d // heads), intermediate_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), hidden_act=str(config.get("hidden_act", "silu")),
        attention_bias=bool(config.get("attention_bias", False)), qk_norm=True,
        vocab_size=int(config["vocab_size"]), num_layers=int(config["num_hidden_layers"]),
        taps=tuple(int(t) for t in config["target_layer_ids"]), block_size=int(config["block_size"]),
        mask_token_id=int(config["mask_token_id"]), markov_rank=rank,
        markov_head_type=str(config.get("markov_head_type", "vanilla")).lower() if rank else "vanilla",
        confidence_head=confidence,
        confidence_with_markov=bool(config.get("confidence_head_with_markov", False)) if confidence else True,
    )


def load_block_drafter(path: Path, target: Target, method: str) -> tuple[Arch, dict[str, torch.Tensor]]:
    """(architecture, state dict for our model) of a DeepSpec DSpark/DFlash folder, checked against ``target``."""
    config = read_config(path)
    arch = block_arch(config, method)
    check_target_fit(config, target)
    arch.check(target)
    state = read_weights(path)
    take_frozen_copies(state, target)
    return arch, state

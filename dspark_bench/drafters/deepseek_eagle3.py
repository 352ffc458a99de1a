"""Load DeepSeek's released Eagle3 drafts (``deepseek-ai/eagle3_*_ttt7``) into :class:`Eagle3Model`.

Format (reference ``deepspec-checkpoint-format.md`` sections 2.3, 3.3, 4.2): a folder with ``config.json``
(a deep copy of the target's HF config plus ``architectures: ["Qwen3Eagle3Model"]``, ``target_layer_ids`` (exactly
5), ``ttt_length``, ``step_loss_decay``, ``draft_num_hidden_layers``, ...) and ``model.safetensors`` (or shards
with ``model.safetensors.index.json``), all BF16, un-prefixed names:
``embed_tokens.weight``, ``fc.weight``, ``layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.self_attn.{q,k}_norm.weight``,
``layers.0.mlp.{gate,up,down}_proj.weight``, ``norm.weight``, ``lm_head.weight``.

Our module has the same names, minus the frozen ``embed_tokens``/``lm_head`` copies: those must equal the
target's own weights (compared in bf16), and the target's are used. A draft that does not fit the target (vocab,
hidden size, RoPE base, layer count, taps, number of draft layers) is refused with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_bench.drafters.chain import Eagle3Model
from dspark_bench.drafters.checkpoint import CheckpointError, read_json
from dspark_bench.drafters.deepseek import frozen_copy_matches, read_weights
from dspark_bench.drafters.layers import LayerSpec, rope_theta

if TYPE_CHECKING:
    from dspark_bench.target.model import Target

ARCHITECTURES = ("Qwen3Eagle3Model", "Eagle3DraftModel")  # both load as Qwen3Eagle3Model in DeepSpec
REQUIRED = ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "target_layer_ids", "ttt_length", "step_loss_decay")
FROZEN = ("embed_tokens.weight", "lm_head.weight")
NUM_TAPS = 5


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json")
    return read_json(path)


def is_deepseek_eagle3(folder: str | Path) -> bool:
    """True when ``folder`` is in DeepSeek's format (HF-style config with ``architectures``)."""
    config = read_config(folder)
    return "architectures" in config and "format" not in config


def check_fit(config: dict[str, Any], target: Target) -> None:
    """Raise :class:`CheckpointError` listing every way this draft config does not fit ``target``."""
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"architecture {arch!r} is not a supported DeepSeek Eagle3 draft; "
                              f"accepted: {', '.join(ARCHITECTURES)}")
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise CheckpointError(f"DeepSeek Eagle3 config.json lacks {', '.join(missing)}")
    problems = []
    layers = int(config.get("draft_num_hidden_layers", config.get("num_hidden_layers", 1)))
    if layers != 1:
        problems.append(f"draft_num_hidden_layers is {layers}; chain drafting needs exactly 1")
    problems += _tap_problems(list(config["target_layer_ids"]), target.num_layers)
    for key, have in (("vocab_size", target.vocab_size), ("hidden_size", target.hidden_size),
                      ("num_target_layers", target.num_layers)):
        if key in config and int(config[key]) != have:
            problems.append(f"{key} is {config[key]} but the target's is {have}")
    theta = rope_theta(config.get("rope_parameters"), config.get("rope_theta"))
    want = rope_theta(getattr(target.config, "rope_parameters", None), getattr(target.config, "rope_theta", None))
    if theta != want:
        problems.append(f"RoPE base {theta:g} differs from the target's {want:g}")
    if problems:
        raise CheckpointError(f"DeepSeek Eagle3 draft does not fit target {target.name!r}: " + "; ".join(problems))


def _tap_problems(taps: list[int], num_layers: int) -> list[str]:
    out = []
    if len(taps) != NUM_TAPS:
        out.append(f"target_layer_ids has {len(taps)} ids; DeepSeek Eagle3 uses exactly {NUM_TAPS}")
    if taps != sorted(set(taps)):
        out.append(f"target_layer_ids {taps} are not strictly increasing")
    if num_layers - 1 in taps:
        out.append(f"target_layer_ids {taps} tap the target's last layer ({num_layers - 1}), which is forbidden")
    bad = [t for t in taps if not -1 <= t <= num_layers - 1]
    if bad:
        out.append(f"target_layer_ids {bad} are outside -1 (the embedding output) and the target's layers "
                   f"0..{num_layers - 2}")
    return out


def _check_frozen(state: dict[str, torch.Tensor], target: Target) -> None:
    """The checkpoint's embedding / LM-head copies must be the target's weights (compared in the checkpoint's
    dtype: :func:`~dspark_bench.drafters.deepseek.frozen_copy_matches`)."""
    ours = {"embed_tokens.weight": target.model.get_input_embeddings().weight,
            "lm_head.weight": target.model.get_output_embeddings().weight}
    for key, mine in ours.items():
        theirs = state[key]
        if theirs.shape != mine.shape:
            raise CheckpointError(f"{key} has shape {tuple(theirs.shape)}, the target's {tuple(mine.shape)}")
        if not frozen_copy_matches(theirs, mine):
            raise CheckpointError(f"{key} differs from the target's weights: this draft was made for another target")


def load(folder: str | Path, target: Target) -> Eagle3Model:
    """Build an :class:`Eagle3Model` from a DeepSeek Eagle3 folder, checked against ``target``."""
    config = read_config(folder)
    check_fit(config, target)
    model = Eagle3Model(LayerSpec.from_config(config), tuple(config["target_layer_ids"]), target)
    state = read_weights(folder)
    expected = set(model.state_dict()) | set(FROZEN)
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: tensor names do not match Qwen3Eagle3Model: "
                              f"missing {missing or 'none'}, unexpected {unexpected or 'none'}")
    _check_frozen(state, target)
    trained = {k: v for k, v in state.items() if k not in FROZEN}
    try:
        model.to(next(iter(trained.values())).dtype).load_state_dict(trained)
    except RuntimeError as exc:  # shape mismatches
        raise CheckpointError(f"{folder}: {exc}") from None
    return model

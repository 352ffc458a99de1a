"""``dspark-bench export --format vllm``: our Eagle3 checkpoint in the layout vLLM's ``llama_eagle3`` loads.

vLLM 0.32.0's ``Eagle3LlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle3.py``) reads a folder with a
Llama-style ``config.json`` (architecture ``LlamaForCausalLMEagle3``, one decoder layer whose attention takes
``2 * hidden_size``) and weights named ``fc.weight``, ``layers.0.*`` and ``norm.weight``; a checkpoint without
``embed_tokens`` / ``lm_head`` shares the target's (``_maybe_share_embeddings``, ``_maybe_share_lm_head``), which
is what ours are trained with, so the exported weights are ours unchanged. The one translation is the tapped
layers: ours are 0-based decoder-layer outputs (HF ``hidden_states[t + 1]``), vLLM's
``eagle_aux_hidden_state_layer_ids`` count the hidden state *entering* a layer, so vLLM id = our tap + 1
(vLLM converts DFlash's ``target_layer_ids`` the same way). Our layer's residual is the fused feature before its
norm and the next step's hidden is the layer output before the final norm: vLLM's defaults
(``norm_before_residual`` false, ``norm_output`` false).

A checkpoint trained over a reduced draft vocabulary (``draft_vocab`` in its weights, ``vocab.py``) exports in
vLLM's own form of one: ``draft_vocab_size`` N in the config, ``lm_head.weight`` [N, d] holding the target LM head's
rows of the listed ids (copied from the target's weights: the head is frozen, so these are the rows we draft with)
and ``d2t`` [N], the offset of each listed id from its draft index (vLLM's ``draft_id_to_target_id``:
target id = draft index + d2t). vLLM then scatters the N logits into a full-vocabulary row with -inf elsewhere,
the draft law ours uses.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dspark_bench.drafters import checkpoint, vocab

ARCHITECTURE = "LlamaForCausalLMEagle3"


def vllm_eagle3_config(meta: dict[str, Any], target_config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's draft ``config.json`` from our checkpoint's config and the target's HF config."""
    if meta.get("method") != "eagle3":
        raise checkpoint.CheckpointError(f"export --format vllm writes eagle3 checkpoints; this one is "
                                         f"{meta.get('method')!r}")
    layer, taps = meta["config"]["layer"], [int(t) for t in meta["config"]["taps"]]
    if layer.get("qk_norm"):
        raise checkpoint.CheckpointError("this eagle3 has per-head q/k norms (a Qwen3 target): vLLM's llama_eagle3 "
                                         "has none; only Llama-target checkpoints export")
    ids = [t + 1 for t in taps]
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama",
        "hidden_size": layer["hidden_size"], "intermediate_size": layer["intermediate_size"],
        "num_attention_heads": layer["num_heads"], "num_key_value_heads": layer["num_kv_heads"],
        "head_dim": layer["head_dim"], "hidden_act": layer["hidden_act"], "rms_norm_eps": layer["rms_norm_eps"],
        "attention_bias": layer["attention_bias"], "mlp_bias": False, "num_hidden_layers": 1,
        "rope_theta": layer["rope_theta"], "rope_scaling": None,
        "max_position_embeddings": target_config.get("max_position_embeddings", 8192),
        "vocab_size": target_config["vocab_size"], "draft_vocab_size": target_config["vocab_size"],
        "target_hidden_size": target_config["hidden_size"], "tie_word_embeddings": False,
        "bos_token_id": target_config.get("bos_token_id"), "eos_token_id": target_config.get("eos_token_id"),
        "eagle_aux_hidden_state_layer_ids": ids,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "torch_dtype": "bfloat16",
    }


def export_vllm(source: Path, target_model: Path, out: Path) -> Path:
    """Write ``out/config.json`` + ``out/model.safetensors`` (our weights, copied byte for byte) and a note of
    where they came from (``dspark_bench_export.json``)."""
    meta, state = checkpoint.load(source)
    target_config = json.loads((Path(target_model) / "config.json").read_text())
    if meta.get("target", {}).get("hidden_size") not in (None, target_config["hidden_size"]):
        raise checkpoint.CheckpointError(f"{source} was trained for a hidden size {meta['target']['hidden_size']}, "
                                         f"the target {target_model} has {target_config['hidden_size']}")
    config = vllm_eagle3_config(meta, target_config)
    ids = state.pop(vocab.STATE_KEY, None)
    unknown = sorted(k for k in state if not k.startswith(("fc.", "layers.0.", "norm.")))
    if unknown:
        raise checkpoint.CheckpointError(f"{source} holds weights vLLM's llama_eagle3 does not read: {unknown}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if ids is None:  # the full head: vLLM shares the target's, and the weights are ours byte for byte
        shutil.copyfile(Path(source) / "model.safetensors", out / "model.safetensors")
    else:
        from safetensors.torch import save_file

        ids = vocab.check_ids(ids.long(), target_config["vocab_size"])
        head = target_lm_head(Path(target_model), target_config)
        config["draft_vocab_size"] = int(ids.numel())
        save_file({**state, "lm_head.weight": head.index_select(0, ids).contiguous(),
                   "d2t": ids - torch.arange(ids.numel())}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "dspark_bench_export.json").write_text(json.dumps(
        {"source": str(source), "method": "eagle3", "target": meta.get("target"), "taps": meta["config"]["taps"],
         "vllm_aux_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
         "draft_vocab_size": config["draft_vocab_size"]}, indent=2) + "\n")
    return out


def target_lm_head(target_model: Path, target_config: dict[str, Any]) -> torch.Tensor:
    """The target's LM head weight [V, d] from its safetensors (the input embedding when the two are tied)."""
    from safetensors import safe_open

    tied = bool(target_config.get("tie_word_embeddings", False))
    names = ("lm_head.weight",) + (("model.embed_tokens.weight", "embed_tokens.weight") if tied else ())
    files = sorted(Path(target_model).glob("*.safetensors"))
    for name in names:
        for path in files:
            with safe_open(str(path), "pt") as f:
                if name in f.keys():
                    return f.get_tensor(name)
    raise checkpoint.CheckpointError(f"no {' or '.join(names)} in the safetensors of {target_model}: a reduced-"
                                     f"vocabulary eagle3 exports the target head's rows it drafts with")


def with_shipped_exports(spec, folder: Path, cache_dir: Path | None = None,
                         say: Callable[[str], None] = lambda msg: None):
    """``spec`` with ``eagle3.model`` pointing at our shipped eagle3 for the target, exported to vLLM's layout in
    ``folder/vllm-drafters/eagle3``, where eagle3 is asked for without a model of its own."""
    import dataclasses

    from dspark_bench.drafters.checkpoint import shipped_folder
    from dspark_bench.target.model import resolve_target

    opts = {k: dict(v) for k, v in spec.drafter_options.items()}
    for name in spec.drafters:
        shipped = shipped_folder(Path(spec.target).name, name) if name == "eagle3" else None
        if shipped and not ({"model", "checkpoint"} & set(opts.get(name, {}))):
            exported = export_vllm(shipped, Path(resolve_target(spec.target, cache_dir)),
                                   Path(folder) / "vllm-drafters" / name)
            opts.setdefault(name, {})["model"] = str(exported)
            say(f"{name}: our shipped checkpoint, exported for vLLM to {exported}")
    return dataclasses.replace(spec, drafter_options=opts)

"""``export --format vllm``: our shipped Eagle3 in the layout vLLM's llama_eagle3 reads (no vLLM needed)."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from dspark_bench.drafters import checkpoint
from dspark_bench.engines.vllm.export import export_vllm, vllm_eagle3_config

SHIPPED = checkpoint.shipped_folder("smollm2-135m", "eagle3")
TARGET = {"vocab_size": 49152, "hidden_size": 576, "max_position_embeddings": 8192, "bos_token_id": 1,
          "eos_token_id": 2}


@pytest.mark.skipif(SHIPPED is None, reason="no shipped eagle3 checkpoint for smollm2-135m")
def test_shipped_eagle3_exports_with_vllm_layer_ids_and_our_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({**TARGET, "tie_word_embeddings": True}))
    head = torch.randn(TARGET["vocab_size"], TARGET["hidden_size"]).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": head}, str(tmp_path / "target" / "model.safetensors"))
    out = export_vllm(SHIPPED, tmp_path / "target", tmp_path / "e3")
    config = json.loads((out / "config.json").read_text())
    meta, state = checkpoint.load(SHIPPED)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [t + 1 for t in meta["config"]["taps"]]
    assert config["target_hidden_size"] * len(meta["config"]["taps"]) == state["fc.weight"].shape[1]
    ids = state["draft_vocab"]  # the shipped Eagle3 drafts over the 8,192-token list
    assert config["draft_vocab_size"] == ids.numel() == 8192
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        # no embed_tokens (vLLM shares the target's); the head is the target's rows of the list, with vLLM's d2t
        assert set(f.keys()) == set(state) - {"draft_vocab"} | {"lm_head.weight", "d2t"}
        assert torch.equal(f.get_tensor("lm_head.weight"), head[ids].to(f.get_tensor("lm_head.weight").dtype))


def test_only_llama_eagle3_checkpoints_export():
    layer = {"hidden_size": 8, "intermediate_size": 16, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,
             "hidden_act": "silu", "rms_norm_eps": 1e-6, "attention_bias": False, "rope_theta": 1e4}
    with pytest.raises(checkpoint.CheckpointError, match="writes eagle3"):
        vllm_eagle3_config({"method": "dspark", "config": {}}, TARGET)
    with pytest.raises(checkpoint.CheckpointError, match="q/k norms"):
        vllm_eagle3_config({"method": "eagle3", "config": {"layer": {**layer, "qk_norm": True}, "taps": [1]}}, TARGET)
    assert vllm_eagle3_config({"method": "eagle3", "config": {"layer": layer, "taps": [0, 3]}},
                              TARGET)["eagle_aux_hidden_state_layer_ids"] == [1, 4]


@pytest.mark.skipif(SHIPPED is None, reason="no shipped eagle3 checkpoint for smollm2-135m")
@pytest.mark.parametrize("tied", [True, False])
def test_reduced_vocabulary_eagle3_exports_vllms_draft_head_and_d2t(tmp_path, tied):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src = tmp_path / "e3-list"
    shutil.copytree(SHIPPED, src)
    state = load_file(str(src / "model.safetensors"))
    state.pop("draft_vocab", None)  # the shipped list is replaced by a 5-token one over a 64-token target
    ids = torch.tensor([0, 2, 5, 40, 63])
    save_file({**state, "draft_vocab": ids}, str(src / "model.safetensors"))
    target = tmp_path / "target"
    target.mkdir()
    config = {**TARGET, "vocab_size": 64, "tie_word_embeddings": tied}
    (target / "config.json").write_text(json.dumps(config))
    head = torch.randn(64, TARGET["hidden_size"])
    save_file({"model.embed_tokens.weight" if tied else "lm_head.weight": head,
               **({} if tied else {"model.embed_tokens.weight": torch.zeros(64, TARGET["hidden_size"])})},
              str(target / "model.safetensors"))
    out = export_vllm(src, target, tmp_path / "out")
    written = load_file(str(out / "model.safetensors"))
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 5
    assert torch.equal(written["lm_head.weight"], head[ids])  # the rows we draft with
    assert torch.equal(written.pop("d2t"), ids - torch.arange(5))  # vLLM: target id = draft index + d2t
    written.pop("lm_head.weight")
    assert written.keys() == state.keys() and all(torch.equal(written[k], state[k]) for k in state)
    (target / "model.safetensors").unlink()
    save_file({"other.weight": head}, str(target / "model.safetensors"))
    with pytest.raises(checkpoint.CheckpointError, match="lm_head"):
        export_vllm(src, target, tmp_path / "out2")

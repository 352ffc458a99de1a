"""Checkpoints behave as their config says: dtype of the frozen copies, the trained proposal length, tap -1, and
the architecture the manifest records (tiny random checkpoints in DeepSpec's format)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import random_prompts, tiny_target
from test_dspark import deepseek_checkpoint, make, start_slot
from test_eagle3_mtp import write_deepseek_eagle3

from dspark_bench.drafters.checkpoint import CheckpointError, trained_proposal_length
from dspark_bench.drafters.deepseek import frozen_copy_matches

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen():
    return tiny_target("qwen3")


def test_a_bf16_checkpoint_loads_on_an_fp16_target(qwen, tmp_path):
    state = deepseek_checkpoint(tmp_path / "ds", qwen)  # bf16 copies of the fp32 target's weights
    half = tiny_target("qwen3", dtype=torch.float16)  # the same weights, rounded to fp16 instead
    emb = half.model.get_input_embeddings().weight
    assert not torch.equal(state["embed_tokens.weight"], emb.to(torch.bfloat16))  # so the old bf16 test refused it
    drafter = make("dspark", half, checkpoint=str(tmp_path / "ds"))
    assert drafter.model.arch.taps == (1, 2, 4)
    deepseek_checkpoint(tmp_path / "other", tiny_target("qwen3", seed=1))
    with pytest.raises(CheckpointError, match="not a copy of target"):
        make("dspark", half, checkpoint=str(tmp_path / "other"))
    write_deepseek_eagle3(tmp_path / "e3", qwen)
    assert make("eagle3", half, checkpoint=str(tmp_path / "e3")).feature_layers == (0, 1, 2, 3, 4)


def test_frozen_copies_are_exact_where_the_dtypes_allow():
    w = torch.randn(64, 32) * 0.05
    assert frozen_copy_matches(w.to(torch.bfloat16), w)  # an fp32 target holds every bf16 value: exact
    off = w.clone()
    off[3, 4] = off[3, 4] * (1 + 2 ** -6)
    assert not frozen_copy_matches(w.to(torch.bfloat16), off.to(torch.bfloat16))  # same dtype: must be exact
    assert not frozen_copy_matches(w.to(torch.bfloat16), off)  # fp32 target: must be exact too
    assert frozen_copy_matches(w.to(torch.bfloat16), w.to(torch.float16))  # one rounding more: tolerated
    assert not frozen_copy_matches(w.to(torch.bfloat16), (w * 1.05).to(torch.float16))
    assert not frozen_copy_matches(w.to(torch.bfloat16), w.t().contiguous().to(torch.float16))


def test_tap_minus_one_is_the_embedding_output(qwen, tmp_path):
    deepseek_checkpoint(tmp_path / "ds", qwen, taps=(-1, 2, 4))
    drafter = make("dspark", qwen, checkpoint=str(tmp_path / "ds"))
    assert drafter.feature_layers == (-1, 2, 4)
    prompt = random_prompts(1, seed=5)[0]
    _, out = qwen.prefill([prompt], (-1,))
    emb = qwen.model.get_input_embeddings()(torch.tensor(prompt))
    torch.testing.assert_close(out.features[0].layers[:, 0], emb)
    prop = drafter.propose(start_slot(drafter, qwen, prompt, block=4))
    assert prop.tokens.shape == (1, 4)
    write_deepseek_eagle3(tmp_path / "e3", qwen, target_layer_ids=[-1, 0, 1, 2, 3])
    assert make("eagle3", qwen, checkpoint=str(tmp_path / "e3")).feature_layers == (-1, 0, 1, 2, 3)
    deepseek_checkpoint(tmp_path / "bad", qwen, taps=(-2, 2, 4))
    with pytest.raises(ValueError, match=r"-1 \(the embedding output\)"):
        make("dspark", qwen, checkpoint=str(tmp_path / "bad"))


def test_the_proposal_length_defaults_to_the_checkpoints(qwen, tmp_path, capsys):
    from dspark_bench.cli.run import DEFAULT_BLOCK_SIZE, resolve_block_size

    deepseek_checkpoint(tmp_path / "b4", qwen)  # block_size 4
    write_deepseek_eagle3(tmp_path / "e3", qwen, ttt_length=4)
    deepseek_checkpoint(tmp_path / "b6", qwen, block_size=6)
    assert trained_proposal_length(tmp_path / "b4") == 4 and trained_proposal_length(tmp_path / "e3") == 4
    opts = {"dspark": {"checkpoint": str(tmp_path / "b4")}, "eagle3": {"checkpoint": str(tmp_path / "e3")}}
    assert resolve_block_size(None, ("none", "dspark", "eagle3"), opts, "tiny") == 4
    assert "warning" not in capsys.readouterr().err
    assert resolve_block_size(6, ("none", "dspark"), opts, "tiny") == 6
    err = " ".join(capsys.readouterr().err.split())
    assert "--block-size 6 differs from the 4 draft tokens dspark's checkpoint was trained to propose" in err
    with pytest.raises(ValueError, match=r"different block sizes \(dspark 4, dflash 6\)"):
        resolve_block_size(None, ("dspark", "dflash"), {**opts, "dflash": {"checkpoint": str(tmp_path / "b6")}},
                           "tiny")
    assert resolve_block_size(None, ("none", "ngram"), {}, "tiny") == DEFAULT_BLOCK_SIZE
    shipped = ("none", "ngram", "dspark", "dflash", "eagle3", "mtp")
    assert resolve_block_size(None, shipped, {}, "smollm2-135m") == 7  # the shipped block drafters' G


def test_run_warns_when_block_size_differs_from_the_checkpoint(qwen, tmp_path, monkeypatch):
    from dspark_bench.cli.main import main
    from dspark_bench.target.model import Target

    loaded = {}
    monkeypatch.setattr(Target, "load", lambda *a, **k: loaded.setdefault("target", True) and 1 / 0)
    deepseek_checkpoint(tmp_path / "b4", qwen)
    res = CliRunner().invoke(main, ["run", "--drafter", "dspark", "--drafter-opt", f"dspark.checkpoint={tmp_path}/b4",
                                    "--block-size", "7", "--out", str(tmp_path / "run")])
    assert "warning: --block-size 7 differs from the 4 draft tokens" in " ".join(res.output.split())
    assert loaded  # a warning, not an error: the run went on to load the target


def test_manifest_shows_the_architecture_the_checkpoint_set(qwen, tmp_path, monkeypatch):
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.native.runner import Run
    from dspark_bench.evaluation.suites import Prompt

    monkeypatch.setattr(qwen, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12], raising=False)
    deepseek_checkpoint(tmp_path / "ds", qwen, taps=(-1, 2, 4), block_size=4)
    write_deepseek_eagle3(tmp_path / "e3", qwen, target_layer_ids=[-1, 0, 1, 2, 3])
    spec = RunSpec(target="tiny", drafters=("dspark", "eagle3"), block_size=4, max_new_tokens=4, warmup=False,
                   drafter_options={"dspark": {"checkpoint": str(tmp_path / "ds")},
                                    "eagle3": {"checkpoint": str(tmp_path / "e3")}})
    Run(spec, qwen, [Prompt("ds", "custom", "p0", 0, "prompt xyz")], tmp_path / "run").execute()
    entries = json.loads((tmp_path / "run" / "manifest.json").read_text())["drafters"]
    assert entries["dspark"]["config"]["num_layers"] == 1  # the option's default, as given ...
    arch = entries["dspark"]["architecture"]  # ... and what the checkpoint set
    assert (arch["num_layers"], arch["taps"], arch["block_size"], arch["markov_rank"]) == (2, [-1, 2, 4], 4, 8)
    assert entries["eagle3"]["architecture"]["taps"] == [-1, 0, 1, 2, 3]
    assert entries["eagle3"]["architecture"]["layer"]["hidden_size"] == 64


def test_our_format_on_an_fp16_target_says_why_it_cannot_be_checked(tmp_path):
    from dspark_bench.drafters import registry

    saved = registry.create("dflash", tiny_target("llama"), {"num_layers": 1}).save(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="cannot check this drafter against an fp16 target.*--dtype bf16"):
        make("dflash", tiny_target("llama", dtype=torch.float16), checkpoint=str(saved))
    assert make("dflash", tiny_target("llama", dtype=torch.bfloat16), checkpoint=str(saved)).model.arch.num_layers == 1

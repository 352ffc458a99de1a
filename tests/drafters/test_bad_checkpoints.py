"""A damaged checkpoint fails with one error that names the file and says what a checkpoint holds: weights that
are not safetensors or were cut short, a config.json or shard index that is not a JSON object. The command line
reports it in one line with exit status 2, before the target loads."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import tiny_target
from test_dspark import deepseek_checkpoint, make
from test_eagle3_mtp import write_deepseek_eagle3

from dspark_bench.drafters import checkpoint, registry, vocab
from dspark_bench.drafters.checkpoint import CheckpointError, trained_proposal_length

pytestmark = pytest.mark.usefixtures("one_thread")

NOT_SAFETENSORS = "is not a readable safetensors file (truncated, or not safetensors"


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


@pytest.fixture(scope="module")
def qwen():
    return tiny_target("qwen3")


@pytest.fixture
def ours(llama, tmp_path):
    """One of our checkpoints (a tiny DFlash), saved whole."""
    return registry.create("dflash", llama, {"num_layers": 1}).save(tmp_path / "ck")


def garbage(file):
    file.write_bytes(b"this is not a safetensors file\n")


def cut_short(file):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [garbage, cut_short])
def test_damaged_weights_name_the_file_when_loaded_and_when_first_read(llama, ours, damage):
    damage(ours / "model.safetensors")
    where = str(ours / "model.safetensors")
    for read in (lambda: checkpoint.load(ours), lambda: make("dflash", llama, checkpoint=str(ours)),
                 lambda: trained_proposal_length(ours)):  # the run's first read, before the target loads
        with pytest.raises(CheckpointError, match=re.escape(NOT_SAFETENSORS)) as err:
            read()
        assert where in str(err.value)


@pytest.mark.parametrize("text, why", [
    (b'{"format": "dspark', "is not valid JSON (Unterminated string starting at: line 1 column 12)"),
    (b"", "is not valid JSON (Expecting value: line 1 column 1)"),
    (b'{"method": "caf\xe9"}', "is not UTF-8 text (byte 0xe9 at offset 15)"),
    (b"[1, 2]", "holds a JSON list"),
])
def test_a_config_that_is_not_a_json_object_names_the_file(llama, ours, text, why):
    (ours / "config.json").write_bytes(text)
    for read in (lambda: checkpoint.load(ours), lambda: make("dflash", llama, checkpoint=str(ours)),
                 lambda: trained_proposal_length(ours)):
        with pytest.raises(CheckpointError) as err:
            read()
        assert str(err.value) == f"{ours / 'config.json'} {why}; a checkpoint's config.json holds one JSON object"


def test_our_config_without_an_architecture_says_so(llama, ours):
    meta = json.loads((ours / "config.json").read_text())
    del meta["config"]
    (ours / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"config.json has no 'config' object \(the drafter's architecture\)"):
        make("dflash", llama, checkpoint=str(ours))


def test_deepseek_block_drafter_weights_cut_short(qwen, tmp_path):
    deepseek_checkpoint(tmp_path / "ds", qwen)
    cut_short(tmp_path / "ds" / "model.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(NOT_SAFETENSORS)):
        make("dspark", qwen, checkpoint=str(tmp_path / "ds"))


def test_deepseek_eagle3_weights_and_config(qwen, tmp_path):
    write_deepseek_eagle3(tmp_path / "e3", qwen)
    garbage(tmp_path / "e3" / "model.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(NOT_SAFETENSORS)):
        make("eagle3", qwen, checkpoint=str(tmp_path / "e3"))
    (tmp_path / "e3" / "config.json").write_text('{"architectures": ["Qwen3Eagle3Model"],')
    with pytest.raises(CheckpointError, match=r"e3/config.json is not valid JSON \(Expecting property name"):
        make("eagle3", qwen, checkpoint=str(tmp_path / "e3"))


def test_sharded_weights_a_bad_index_a_missing_shard_and_a_bad_shard(qwen, tmp_path):
    folder = tmp_path / "ds"
    deepseek_checkpoint(folder, qwen)
    (folder / "model.safetensors").rename(folder / "part-1.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text("{weight_map}")
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json is not valid JSON"):
        make("dspark", qwen, checkpoint=str(folder))
    index.write_text(json.dumps({"weight_map": {"fc.weight": "part-1.safetensors", "norm.weight": "part-2.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"index.json names shards that are not in .*: part-2.safetensors"):
        make("dspark", qwen, checkpoint=str(folder))
    index.write_text(json.dumps({"weight_map": {"fc.weight": "part-1.safetensors"}}))
    assert make("dspark", qwen, checkpoint=str(folder)).model.arch.taps == (1, 2, 4)  # the shard alone is whole
    cut_short(folder / "part-1.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(f"part-1.safetensors {NOT_SAFETENSORS}")):
        make("dspark", qwen, checkpoint=str(folder))


def test_a_draft_vocabulary_file_that_is_not_json_names_the_file(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text('{"format": "dspark-bench-draft-vocab/1", "ids": [1, 2')
    with pytest.raises(vocab.VocabError, match=f"{path}: not a {vocab.FORMAT} file \\(not readable JSON"):
        vocab.read_vocab(path)
    path.write_text("[1, 2]")
    with pytest.raises(vocab.VocabError, match=f"{path}: not a {vocab.FORMAT} file; write one with"):
        vocab.read_vocab(path)


def _one_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    return lines[0]


def test_cli_reports_damaged_weights_in_one_line_before_the_target_loads(ours, tmp_path, monkeypatch):
    from dspark_bench.cli.main import main
    from dspark_bench.target.model import Target

    loaded = []
    monkeypatch.setattr(Target, "load", lambda *a, **k: loaded.append(1))
    cut_short(ours / "model.safetensors")
    res = CliRunner().invoke(main, ["run", "--drafter", "dflash", "--drafter-opt", f"dflash.checkpoint={ours}",
                                    "--limit", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "run")])
    line = _one_line(res)
    assert line.startswith(f"error: {ours / 'model.safetensors'} {NOT_SAFETENSORS}")
    assert not loaded and not (tmp_path / "run").exists()
    res = CliRunner().invoke(main, ["export", "--format", "vllm", "--checkpoint", str(ours), "--out",
                                    str(tmp_path / "exported")])
    assert NOT_SAFETENSORS in _one_line(res) and not (tmp_path / "exported").exists()

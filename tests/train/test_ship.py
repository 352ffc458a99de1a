"""dspark_bench.train.ship and ``dspark-bench ship-drafters``: trained drafters into the shipped layout, in bf16."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from dspark_bench.cli.study import ship_drafters


def _run(folder, taus):
    (folder / "final").mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "tau": t, "acceptance": [t - 1.0], "seconds": 2.0}) for i, t in enumerate(taus)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_shipping_new_weights_removes_the_calibration_of_the_old_ones(tmp_path):
    from safetensors.torch import load_file, save_file

    run = _run(tmp_path / "runs" / "dspark-2", [1.1, 1.2, 1.3])
    save_file({"w": torch.full((3,), 1.0 + 2.0**-12), "draft_vocab": torch.tensor([0, 5, 7])},
              str(run / "final" / "model.safetensors"))
    (run / "final" / "config.json").write_text('{"block_size": 7}')
    dest = tmp_path / "shipped" / "dspark"
    dest.mkdir(parents=True)
    (dest / "calibration.json").write_text("{}")  # fitted on the weights about to be replaced
    done = CliRunner().invoke(ship_drafters, [str(tmp_path / "runs"), str(tmp_path / "shipped"), "dspark=dspark-2"])
    assert done.exit_code == 0, done.output
    assert not (dest / "calibration.json").exists() and f"removed {dest / 'calibration.json'}" in done.output
    assert f"dspark: 0.0 MB from {run}" in done.output and "total 0.0 MB in" in done.output
    state = load_file(str(dest / "model.safetensors"))
    assert state["w"].dtype == torch.bfloat16 and torch.equal(state["w"], torch.ones(3, dtype=torch.bfloat16))
    assert torch.equal(state["draft_vocab"], torch.tensor([0, 5, 7]))  # integer tensors keep their type
    assert json.loads((dest / "config.json").read_text()) == {"block_size": 7}
    summary = json.loads((dest / "train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["last"]["tau"] == 1.3
    done = CliRunner().invoke(ship_drafters, [str(tmp_path / "runs"), str(tmp_path / "shipped"), "dflash"])
    assert done.exit_code == 2 and "no finished checkpoint" in done.output

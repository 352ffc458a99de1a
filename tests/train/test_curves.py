"""dspark_bench.train.curves and ``dspark-bench study train-curves``: training curves in windows and the stopping rule."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from dspark_bench.cli.study import train_curves
from dspark_bench.train.curves import CurvesError, curves


def _log(folder, taus, planned=None, torn=False):
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "tau": t, "acceptance": [t - 1.0], "seconds": 2.0}) for i, t in enumerate(taus)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n" + ('{"step": ' if torn else ""))
    if planned:
        (folder / "train_config.json").write_text(json.dumps({"steps": planned}))
    return folder


def test_train_curves_flat_only_when_the_last_quarter_stops_rising(tmp_path):
    saturated = _log(tmp_path / "saturated", [1.8 - 0.8 * math.exp(-s / 60) for s in range(800)], planned=800)
    rising = _log(tmp_path / "rising", [1.0 + 0.001 * s for s in range(800)], planned=1600, torn=True)
    # the ablation's 480-step dspark run (a cut of its train_log.jsonl.gz): its last window looks flat, but it rose
    # 5% over its last quarter, so it was still learning
    recipe = curves(FIXTURES / "train" / "dspark7-480", 8)
    assert not recipe["flat"] and recipe["gain_q4"] > 0.04 and recipe["complete"] and recipe["steps"] == 480
    a, b = curves(saturated, 10), curves(rising, 10)
    assert a["flat"] and a["complete"] and a["gain_q4"] < 0.01
    assert not b["flat"] and not b["complete"] and b["steps"] == 800 and b["gain_q4"] > 0.1  # torn line dropped
    assert b["tau"][0] == pytest.approx(1.0 + 0.001 * 39.5)
    done = CliRunner().invoke(train_curves, [str(saturated), str(rising), "--json", str(tmp_path / "c.json")])
    assert done.exit_code == 0, done.output
    assert "| saturated | 800 |" in done.output and "| rising | 800 of 1600 |" in done.output
    assert [r["flat"] for r in json.loads((tmp_path / "c.json").read_text())] == [True, False]
    with pytest.raises(CurvesError, match="too few"):
        curves(_log(tmp_path / "short", [1.0] * 7), 2)
    assert a["heldout"] == [] and a["heldout_flat"] is None
    for args, message in (([str(saturated), "--windows", "1"], "at least 2"),
                          ([str(tmp_path)], "no train_log.jsonl")):
        done = CliRunner().invoke(train_curves, args)
        assert done.exit_code == 2 and message in done.output


def test_train_curves_judge_a_run_with_held_out_scores_on_them(tmp_path):
    """Training tau still rising, held-out tau flat from step 600: the held-out verdict says flat."""
    run = _log(tmp_path / "run", [1.0 + 0.001 * s for s in range(800)], planned=800)
    rows = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    held = {200: 1.30, 400: 1.40, 600: 1.500, 800: 1.505}
    for r in rows:
        r["heldout"] = {"tau": held[r["step"]], "acceptance": [held[r["step"]] - 1]} if r["step"] in held else None
    (run / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = curves(run, 10)
    assert not c["flat"] and c["heldout_flat"] and c["heldout_gain"] == pytest.approx(1.505 / 1.5 - 1)
    assert [h["step"] for h in c["heldout"]] == [200, 400, 600, 800]
    done = CliRunner().invoke(train_curves, [str(run)])
    assert done.exit_code == 0 and "Held-out tau of run by step: 200: 1.300" in done.output

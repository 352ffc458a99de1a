"""Calibration metrics (ECE, AUROC, Brier, reliability bins), Sequential Temperature Scaling and the held-out
prompt source, on hand-computed and synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_bench.core.records import RequestRecord
from dspark_bench.scheduling.calibration import (
    CalibrationError,
    Rounds,
    apply_temperatures,
    auroc,
    brier,
    calibration_report,
    ece,
    fit_sts,
    load_temperatures,
    prefix_samples,
    reliability_bins,
    rounds_from_records,
    save_calibration,
)


def test_metrics_on_hand_computed_cases():
    pred, obs = [0.1, 0.12, 0.9, 0.95], [0, 1, 1, 1]
    # bins 2 (0.10, 0.12) and 18, 19: |0.11 - 0.5| * 2 + |0.9 - 1| + |0.95 - 1|, over 4
    assert ece(pred, obs) == pytest.approx((0.39 * 2 + 0.1 + 0.05) / 4)
    assert reliability_bins(pred, obs) == [[pytest.approx(0.11), 0.5, 2], [0.9, 1.0, 1], [0.95, 1.0, 1]]
    assert brier(pred, obs) == pytest.approx(np.mean([0.01, 0.88**2, 0.01, 0.0025]))
    assert auroc(pred, obs) == pytest.approx(1.0)  # every positive above the negative
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5  # ties count half
    assert auroc([0.2, 0.8], [1, 0]) == 0.0
    assert auroc([0.1, 0.2], [1, 1]) is None
    assert ece([1.0], [1]) == 0.0  # 1.0 falls in the last (closed) bin


def test_temperature_scaling_is_order_preserving_and_identity_at_one():
    rng = np.random.default_rng(0)
    c = np.sort(rng.uniform(0.001, 0.999, 500))
    for temp in (0.1, 0.5, 1.0, 3.0, 20.0):
        out = apply_temperatures(c[None, :].T, [temp])[:, 0]
        assert np.all(np.diff(out) >= 0)  # monotone; strictly so until float64 saturates at 0 or 1 (T = 0.1)
        assert temp == 0.1 or np.all(np.diff(out) > 0)
    assert np.array_equal(apply_temperatures(c[None, :], [1.0] * 500), c[None, :])
    assert apply_temperatures(np.array([[0.6, 0.6]]), [0.25])[0, 1] == 0.6  # positions past the list keep T = 1


def _overconfident_rounds(n=4000, gamma=5, sharpen=3.0, seed=0) -> tuple[Rounds, np.ndarray]:
    """True conditional acceptance p_k per round and position; the predictor reports sigmoid(3 logit p)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 0.95, (n, gamma))
    survive = rng.uniform(size=(n, gamma)) < p
    accepted = np.where(survive.all(1), gamma, np.argmin(survive, axis=1))
    conf = 1 / (1 + np.exp(-sharpen * np.log(p / (1 - p))))
    return Rounds(conf, np.full(n, gamma), accepted), p


def test_sts_undoes_overconfidence_and_lowers_ece():
    rounds, _ = _overconfident_rounds()
    temps = fit_sts(rounds)
    # sharpened 3x: T_1 near 3; later positions calibrate a product, where ECE is flat over a range of T
    assert 2.0 < temps[0] < 4.5 and all(t > 1.0 for t in temps), temps
    report = calibration_report(rounds, temps)
    for pos in report["positions"]:
        assert pos["after"]["ece"] < pos["before"]["ece"]
        assert pos["n"] == 4000 and pos["before"]["bins"] and pos["temperature"] == temps[pos["k"] - 1]
    assert report["summary"]["ece_after"] < 0.03 < report["summary"]["ece_before"]


def test_sts_uses_only_rounds_that_verified_position_k():
    rounds, _ = _overconfident_rounds(n=200)
    short = Rounds(rounds.confidence, np.where(np.arange(200) < 100, 1, 5), rounds.accepted)
    pred, obs = prefix_samples(short, 2)
    assert len(pred) == len(obs) == 100
    assert fit_sts(short, min_samples=150)[1:] == (1.0, 1.0, 1.0, 1.0)  # too few rounds past k = 1: T stays 1


def test_calibration_file_round_trips_and_rejects_unknown_keys(tmp_path):
    rounds, _ = _overconfident_rounds(n=500)
    temps = fit_sts(rounds)
    path = tmp_path / "calibration.json"
    save_calibration(calibration_report(rounds, temps, {"drafter": "synthetic"}), path)
    assert load_temperatures(path) == pytest.approx(temps)
    data = json.loads(path.read_text())
    assert set(data["positions"][0]) == {"k", "n", "temperature", "before", "after"}
    assert set(data["positions"][0]["before"]) == {"ece", "auroc", "brier", "bins"}
    data["positions"][0]["extra"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="keys"):
        load_temperatures(path)
    with pytest.raises(CalibrationError, match="not found"):
        load_temperatures(tmp_path / "missing.json")


def _record(rounds, confidence, status="ok") -> RequestRecord:
    return RequestRecord("d", "fixed", "ds", "chat", "p0", 0, 0, 1, 1, status, "length", 5, (1, 2, 3), tuple(rounds),
                         tuple((0.0, 0.0, 0.0, 0.0) for _ in rounds), 0.0, 0.0, confidence)


def test_rounds_from_records_pads_and_skips_records_without_confidences():
    recs = [_record([(3, 3, 1, 2), (1, 1, 1, 2)], ((0.9, 0.5, 0.4), (0.7,))),
            _record([(2, 2, 0, 1)], None), _record([(2, 2, 2, 3)], ((0.8, 0.8),), status="error")]
    rounds = rounds_from_records(recs)
    assert rounds.confidence.shape == (2, 3) and np.isnan(rounds.confidence[1, 1:]).all()
    assert rounds.verified.tolist() == [3, 1] and rounds.accepted.tolist() == [1, 1]
    pred, obs = prefix_samples(rounds, 1)
    assert pred.tolist() == pytest.approx([0.9, 0.7]) and obs.tolist() == [1.0, 1.0]


def test_heldout_prompts_are_disjoint_from_the_evaluation_selection():
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.sweep import heldout_prompts

    held = heldout_prompts("chat", 10, 8, 980406)
    evaluation = load_suite("chat", 8, 980406)
    assert len(held) == 10
    assert not {p.prompt_id for p in held} & {p.prompt_id for p in load_suite("chat", 5, 980406)}
    assert not {p.prompt_id for p in held} & {p.prompt_id for p in evaluation}
    assert {p.index for p in held} == set(range(8, 18))  # distinct per-request seeds too


def test_generated_prompts_avoid_evaluation_and_training_texts():
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.sweep import generated_prompts
    from dspark_bench.train.prompts import build_prompts

    held = generated_prompts(48, 7, "all", None, 7)  # the shipped calibration's prompts
    assert len(held) == 48 and len({p.prompt_id for p in held}) == 48
    training = {t.text for t in build_prompts(6144, 0)}  # data/smollm2/train-6k: 5 of these 48 under 4,000
    assert set(build_prompts(4000, 0)) <= set(build_prompts(6144, 0))  # the smaller recipe's prompts are covered
    evaluation = {p.text for p in load_suite("all", None, 7)}
    assert not {p.text for p in held} & (training | evaluation)
    with pytest.raises(ValueError, match="training seed"):
        generated_prompts(5, 0, "chat", None, 1)


def test_calibration_is_found_with_the_drafter(tmp_path):
    from types import SimpleNamespace

    from dspark_bench.engines.native.runner import calibration_for

    (tmp_path / "calibration.json").write_text("{}")
    assert calibration_for(SimpleNamespace(config=SimpleNamespace(checkpoint=str(tmp_path)))) == str(
        tmp_path / "calibration.json")
    named = SimpleNamespace(config=SimpleNamespace(calibration="x.json", checkpoint=str(tmp_path)))
    assert calibration_for(named) == "x.json"  # the config's own field wins
    assert calibration_for(SimpleNamespace(config=SimpleNamespace(checkpoint=None))) is None


def test_shipped_calibration_reaches_runs_and_lm_eval_schedulers(tmp_path, monkeypatch):
    """A drafter loaded from its shipped folder finds the calibration.json shipped beside it, and the options
    every entry point resolves (runs, sweeps, lm-eval) carry it to confidence schedulers only."""
    from types import SimpleNamespace

    from dspark_bench.drafters import checkpoint
    from dspark_bench.engines.native import runner

    monkeypatch.setattr(checkpoint, "SHIPPED_ROOT", tmp_path)
    (tmp_path / "tiny" / "dspark").mkdir(parents=True)
    (tmp_path / "tiny" / "dspark" / "calibration.json").write_text("{}")
    drafter = SimpleNamespace(name="dspark", target=SimpleNamespace(name="tiny"),
                              config=SimpleNamespace(checkpoint=None))
    want = str(tmp_path / "tiny" / "dspark" / "calibration.json")
    assert runner.calibration_for(drafter) == want
    assert runner.resolve_scheduler_options("threshold", {}, None, drafter) == {"calibration": want}
    assert "calibration" not in runner.resolve_scheduler_options("fixed", {}, None, drafter)
    other = SimpleNamespace(name="dspark", target=SimpleNamespace(name="other"), config=SimpleNamespace(checkpoint=None))
    assert runner.calibration_for(other) is None

"""Calibration of predicted prefix survival: Sequential Temperature Scaling (STS) and its metrics. Pure.

Terms (paper section 3.2.1, reference sections 3 and 4.3):

* ``c_k``: the drafter's conditional confidence that draft token k survives given 1..k-1 did.
* **predicted prefix survival** ``A_k = prod_{i<=k} c_i``; **observed** prefix acceptance ``1[A >= k]``,
  counted only over rounds that verified at least k tokens (``verified >= k``).
* **STS**: for k = 1, 2, ... in turn, with T_1..T_{k-1} already fixed, pick the temperature T_k on a grid
  that minimises the ECE of ``A_k`` with ``c_k <- sigmoid(logit(c_k) / T_k)``. T > 0 keeps each c_k's order.
  Positions with fewer than ``min_samples`` rounds keep T = 1.
* **ECE** (20 equal-width bins on [0, 1], the last bin closed) = sum_b (n_b / N) |mean_pred_b - mean_obs_b|.
* **AUROC** = P(pred_pos > pred_neg) + 0.5 P(pred_pos = pred_neg), exact (Mann-Whitney with mid-ranks).
* **Brier** = mean (pred - obs)^2.
* **reliability bins**: ``[mean_pred, mean_obs, count]`` per non-empty bin.

``calibration.json`` (written next to a drafter's checkpoint, read by the schedulers that use confidences)::

    {"source": {...}, "summary": {...}, "positions": [{"k", "n", "temperature",
     "before": {"ece", "auroc", "brier", "bins"}, "after": {...}}]}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.stats import rankdata

if TYPE_CHECKING:
    from dspark_bench.core.records import RequestRecord

BINS = 20
MIN_SAMPLES = 50
_EPS = 1e-12
CALIBRATION_KEYS = frozenset({"source", "summary", "positions"})
POSITION_KEYS = frozenset({"k", "n", "temperature", "before", "after"})


class CalibrationError(ValueError):
    """A calibration file that cannot be used, or data that cannot be calibrated."""


def default_grid() -> np.ndarray:
    """241 log-spaced temperatures from 0.05 to 20 (1.0 is on the grid)."""
    return np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))


def apply_temperatures(confidence, temperatures: Sequence[float]):
    """c_k <- sigmoid(logit(c_k) / T_k) on the last axis of ``confidence`` [..., k] (torch or numpy); positions
    beyond ``temperatures`` keep T = 1. Returns the same kind, float64 for numpy and the input dtype for torch."""
    if isinstance(confidence, torch.Tensor):
        out = apply_temperatures(confidence.detach().double().cpu().numpy(), temperatures)
        return torch.from_numpy(out).to(confidence.dtype)
    c = np.array(confidence, dtype=np.float64)
    for k, temp in enumerate(temperatures[: c.shape[-1]]):
        if temp != 1.0:  # T = 1 is the identity, kept exact (no logit round trip)
            c[..., k] = _sigmoid(_logit(c[..., k]) / temp)
    return c


def _logit(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, _EPS, 1 - _EPS)
    return np.log(c) - np.log1p(-c)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


# ---- metrics ------------------------------------------------------------------------------------------------
def _bin_index(pred: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum((np.asarray(pred) * bins).astype(np.int64), bins - 1)


def reliability_bins(pred, obs, bins: int = BINS) -> list[list[float]]:
    """[mean_pred, mean_obs, count] for each non-empty equal-width bin, in bin order."""
    pred, obs = np.asarray(pred, np.float64), np.asarray(obs, np.float64)
    idx = _bin_index(pred, bins)
    count = np.bincount(idx, minlength=bins)
    sp, so = np.bincount(idx, pred, bins), np.bincount(idx, obs, bins)
    return [[float(sp[b] / count[b]), float(so[b] / count[b]), int(count[b])] for b in range(bins) if count[b]]


def ece(pred, obs, bins: int = BINS) -> float:
    pred, obs = np.asarray(pred, np.float64), np.asarray(obs, np.float64)
    if pred.size == 0:
        return float("nan")
    idx = _bin_index(pred, bins)
    gap = np.abs(np.bincount(idx, pred, bins) - np.bincount(idx, obs, bins))  # n_b |mean_pred_b - mean_obs_b|
    return float(gap.sum() / pred.size)


def auroc(pred, obs) -> float | None:
    """Exact AUROC with ties counted half; None when only one class is present."""
    pred, obs = np.asarray(pred, np.float64), np.asarray(obs).astype(bool)
    n_pos, n_neg = int(obs.sum()), int((~obs).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = rankdata(pred)
    return float((ranks[obs].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def brier(pred, obs) -> float:
    pred, obs = np.asarray(pred, np.float64), np.asarray(obs, np.float64)
    return float(np.mean((pred - obs) ** 2)) if pred.size else float("nan")


def quality(pred, obs, bins: int = BINS) -> dict[str, Any]:
    return {"ece": ece(pred, obs, bins), "auroc": auroc(pred, obs), "brier": brier(pred, obs),
            "bins": reliability_bins(pred, obs, bins)}


# ---- data ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rounds:
    """Recorded rounds with confidences. confidence: [N, gamma] (NaN past ``proposed``); verified, accepted: [N]."""

    confidence: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray


def rounds_from_records(records: Sequence[RequestRecord]) -> Rounds:
    """Every round of every ok record that carries confidences."""
    rows, ver, acc = [], [], []
    for rec in records:
        if not rec.ok or rec.confidence is None:
            continue
        for (_, verified, accepted, _), conf in zip(rec.rounds, rec.confidence, strict=True):
            rows.append(conf)
            ver.append(verified)
            acc.append(accepted)
    width = max((len(r) for r in rows), default=0)
    conf = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        conf[i, : len(r)] = r
    return Rounds(conf, np.asarray(ver, np.int64), np.asarray(acc, np.int64))


def prefix_samples(rounds: Rounds, k: int, temperatures: Sequence[float] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(predicted A_k with the given temperatures, observed 1[A >= k]) over rounds with verified >= k."""
    keep = rounds.verified >= k
    conf = apply_temperatures(rounds.confidence[keep, :k], temperatures)
    return np.prod(conf, axis=1), (rounds.accepted[keep] >= k).astype(np.float64)


# ---- STS ----------------------------------------------------------------------------------------------------
def fit_sts(rounds: Rounds, grid: np.ndarray | None = None, bins: int = BINS,
            min_samples: int = MIN_SAMPLES) -> tuple[float, ...]:
    """Sequential Temperature Scaling: T_1, T_2, ... left to right (module docstring). Ties on ECE go to the
    temperature closest to 1 (in log)."""
    grid = default_grid() if grid is None else np.asarray(grid, np.float64)
    order = np.argsort(np.abs(np.log(grid)), kind="stable")  # T = 1 first, then outwards
    temps: list[float] = []
    for k in range(1, rounds.confidence.shape[1] + 1):
        keep = rounds.verified >= k
        if keep.sum() < min_samples:
            temps.append(1.0)
            continue
        prev = np.prod(apply_temperatures(rounds.confidence[keep, : k - 1], temps), axis=1)
        logit_k = _logit(rounds.confidence[keep, k - 1])
        obs = (rounds.accepted[keep] >= k).astype(np.float64)
        errors = [ece(prev * _sigmoid(logit_k / grid[i]), obs, bins) for i in order]
        temps.append(float(grid[order[int(np.argmin(errors))]]))
    return tuple(temps)


def calibration_report(rounds: Rounds, temperatures: Sequence[float], source: dict[str, Any] | None = None,
                       bins: int = BINS) -> dict[str, Any]:
    """The ``calibration.json`` content: per position before/after quality plus count-weighted summaries."""
    positions = []
    for k in range(1, len(temperatures) + 1):
        raw, obs = prefix_samples(rounds, k)
        if obs.size == 0:
            continue
        cal, _ = prefix_samples(rounds, k, temperatures)
        positions.append({"k": k, "n": int(obs.size), "temperature": float(temperatures[k - 1]),
                          "before": quality(raw, obs, bins), "after": quality(cal, obs, bins)})
    return {"source": source or {}, "summary": _summary(positions), "positions": positions}


def _summary(positions: list[dict[str, Any]]) -> dict[str, Any]:
    """Count-weighted means over positions of ECE and Brier (AUROC over positions where it is defined)."""
    out: dict[str, Any] = {}
    for when in ("before", "after"):
        for metric in ("ece", "auroc", "brier"):
            pairs = [(p["n"], p[when][metric]) for p in positions if p[when][metric] is not None]
            total = sum(n for n, _ in pairs)
            out[f"{metric}_{when}"] = sum(n * v for n, v in pairs) / total if total else None
    return out


def save_calibration(report: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def load_temperatures(path: str | Path) -> tuple[float, ...]:
    """T_1..T_gamma from a ``calibration.json``; a position missing from the file keeps T = 1."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"calibration file {path} not found; fit one with `dspark-bench calibrate`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # ValueErrors whose message names no file
        raise CalibrationError(f"{path} is not a readable calibration file, a UTF-8 JSON object ({exc}); fit "
                               "one with `dspark-bench calibrate`") from None
    if not isinstance(data, dict) or set(data) - CALIBRATION_KEYS or "positions" not in data:
        raise CalibrationError(f"{path}: expected keys {sorted(CALIBRATION_KEYS)} with 'positions'")
    temps: dict[int, float] = {}
    for pos in data["positions"]:
        if set(pos) != POSITION_KEYS:
            raise CalibrationError(f"{path}: a position has keys {sorted(pos)}; expected {sorted(POSITION_KEYS)}")
        if not pos["temperature"] > 0:
            raise CalibrationError(f"{path}: position {pos['k']} has temperature {pos['temperature']}; must be > 0")
        temps[int(pos["k"])] = float(pos["temperature"])
    return tuple(temps.get(k, 1.0) for k in range(1, max(temps, default=0) + 1))

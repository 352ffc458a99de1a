"""Optional result files beside the runs, parsed into frozen dataclasses (unknown or missing keys are errors).

Each is found by its file name, inside a run folder, in a folder of its own, or named directly. Numbers are
read as recorded: the report never derives a rate from them.

``profile.json``: the engine's profiled step rate, one row per context length::

    {"context_lengths": [512, 2048], "batch_tokens": [1, 8, 64], "steps_per_s": [[40.1, 39.0, 30.2], [...]],
     "target": "...", "device": "...", "dtype": "...", "note": "..."}          # the last four optional

``sweep.json``: a static-threshold sweep (paper Figure 5); per step = per verification round::

    {"drafter": "dspark", "points": [{"theta": 0.0, "domain": "math", "accepted_per_step": 5.4,
     "rejected_per_step": 1.6, "acceptance_rate": 0.769}], "target": "...", "scheduler": "...", "note": "..."}

  ``acceptance_rate`` = accepted / verified draft tokens (1 - waste in ``metrics.py``).

``calibration.json``: confidence calibration before/after (paper Figure 6); ``after`` may be null::

    {"drafter": "dspark", "method": "sts",
     "positions": [{"k": 1, "before": {"ece": 0.057, "auroc": 0.818, "brier": 0.12}, "after": {...}}],
     "reliability": [{"stage": "before", "k": 1, "mean_pred": [...], "frac_pos": [...], "count": [...]}],
     "summary": {"before": {"ece": .., "auroc": .., "brier": ..}, "after": {...}},      # optional
     "target": "...", "dataset": "...", "note": "..."}                                # optional

  ``k`` null in a reliability curve = pooled over positions; ``frac_pos`` = observed share of 1[A >= k].

``concurrency.json`` (measured) and ``simulation.json`` (simulated), one schema (paper Figures 7-8)::

    {"points": [{"drafter": "dspark", "source": "measured", "concurrency": 8, "throughput_tok_s": 310.0,
     "per_user_tps": 38.7, "verify_budget": 4.2}], "target": "...", "throughput_unit": "tok/s", "note": "..."}

  ``source`` is "measured" or "simulated"; ``verify_budget`` = tokens verified per request per step
  (including the current token), or null.

``lossless.json``: the lossless battery, a list of rows or ``{"rows": [...], "alpha": 0.01, "note": "..."}``::

    {"test": "chi2 first token", "configuration": "dspark T=1", "n": 20000, "statistic": 12.3,
     "p_value": 0.42, "verdict": "pass", "is_control": false}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("profile", "sweep", "calibration", "concurrency", "simulation", "lossless")


class ReportError(ValueError):
    """An input of the report that cannot be read: what was wrong and what is accepted."""


def _obj(data: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise ReportError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown, missing = sorted(set(data) - set(required) - set(optional)), sorted(set(required) - set(data))
    if unknown or missing:
        raise ReportError(f"{where}: unknown keys {unknown}, missing keys {missing}; "
                          f"required {list(required)}, optional {list(optional)}")
    return data


def _num(value: Any, where: str, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReportError(f"{where}: expected a finite number{' or null' if nullable else ''}, got {value!r:.40}")
    return float(value)


def _int(value: Any, where: str, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(f"{where}: expected an integer{' or null' if nullable else ''}, got {value!r:.40}")
    return value


def _str(value: Any, where: str, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ReportError(f"{where}: expected a string, got {value!r:.40}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _nums(value: Any, where: str) -> tuple[float, ...]:
    return tuple(_num(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))


@dataclass(frozen=True)
class Profile:
    source: Path
    context_lengths: tuple[int, ...]
    batch_tokens: tuple[int, ...]
    steps_per_s: tuple[tuple[float, ...], ...]  # [context length][batch tokens]
    target: str | None = None
    device: str | None = None
    dtype: str | None = None
    note: str | None = None


def parse_profile(data: Any, source: Path) -> Profile:
    w = str(source)
    d = _obj(data, w, ("context_lengths", "batch_tokens", "steps_per_s"), ("target", "device", "dtype", "note"))
    ctx = tuple(_int(v, f"{w}: context_lengths") for v in _list(d["context_lengths"], w))
    batch = tuple(_int(v, f"{w}: batch_tokens") for v in _list(d["batch_tokens"], w))
    sps = tuple(_nums(row, f"{w}: steps_per_s[{i}]") for i, row in enumerate(_list(d["steps_per_s"], w)))
    if len(sps) != len(ctx) or any(len(row) != len(batch) for row in sps):
        raise ReportError(f"{w}: steps_per_s must have one row per context length ({len(ctx)}) "
                          f"of one value per batch_tokens entry ({len(batch)})")
    return Profile(source, ctx, batch, sps, *(_str(d.get(k), w, True) for k in ("target", "device", "dtype", "note")))


@dataclass(frozen=True)
class SweepPoint:
    theta: float
    domain: str
    accepted_per_step: float
    rejected_per_step: float
    acceptance_rate: float


@dataclass(frozen=True)
class Sweep:
    source: Path
    drafter: str
    points: tuple[SweepPoint, ...]
    target: str | None = None
    scheduler: str | None = None
    note: str | None = None


def parse_sweep(data: Any, source: Path) -> Sweep:
    w = str(source)
    d = _obj(data, w, ("drafter", "points"), ("target", "scheduler", "note"))
    keys = ("theta", "domain", "accepted_per_step", "rejected_per_step", "acceptance_rate")
    points = []
    for i, p in enumerate(_list(d["points"], w)):
        p = _obj(p, f"{w}: points[{i}]", keys)
        points.append(SweepPoint(_num(p["theta"], w), _str(p["domain"], w), *(_num(p[k], w) for k in keys[2:])))
    return Sweep(source, _str(d["drafter"], w), tuple(points),
                 *(_str(d.get(k), w, True) for k in ("target", "scheduler", "note")))


@dataclass(frozen=True)
class Scores:
    ece: float | None
    auroc: float | None
    brier: float | None


@dataclass(frozen=True)
class CalibrationPosition:
    k: int
    before: Scores
    after: Scores | None


@dataclass(frozen=True)
class ReliabilityCurve:
    stage: str  # "before" | "after"
    k: int | None  # None: pooled over positions
    mean_pred: tuple[float, ...]
    frac_pos: tuple[float, ...]
    count: tuple[float, ...]


@dataclass(frozen=True)
class Calibration:
    source: Path
    drafter: str
    method: str
    positions: tuple[CalibrationPosition, ...]
    reliability: tuple[ReliabilityCurve, ...]
    summary: Mapping[str, Scores] | None = None
    target: str | None = None
    dataset: str | None = None
    note: str | None = None


def _scores(data: Any, where: str) -> Scores | None:
    if data is None:
        return None
    d = _obj(data, where, (), ("ece", "auroc", "brier"))
    return Scores(*(_num(d.get(k), f"{where}.{k}", True) for k in ("ece", "auroc", "brier")))


def _curve(data: Any, where: str) -> ReliabilityCurve:
    d = _obj(data, where, ("stage", "k", "mean_pred", "frac_pos", "count"))
    if d["stage"] not in ("before", "after"):
        raise ReportError(f"{where}: stage must be 'before' or 'after', got {d['stage']!r}")
    curve = ReliabilityCurve(d["stage"], _int(d["k"], f"{where}.k", True), _nums(d["mean_pred"], where),
                             _nums(d["frac_pos"], where), _nums(d["count"], where))
    if not len(curve.mean_pred) == len(curve.frac_pos) == len(curve.count):
        raise ReportError(f"{where}: mean_pred, frac_pos and count must have the same length (one per bin)")
    return curve


def parse_calibration(data: Any, source: Path) -> Calibration:
    w = str(source)
    d = _obj(data, w, ("drafter", "method", "positions", "reliability"), ("summary", "target", "dataset", "note"))
    positions = []
    for i, p in enumerate(_list(d["positions"], w)):
        p = _obj(p, f"{w}: positions[{i}]", ("k", "before"), ("after",))
        positions.append(CalibrationPosition(_int(p["k"], w), _scores(p["before"], f"{w}: positions[{i}].before"),
                                             _scores(p.get("after"), f"{w}: positions[{i}].after")))
    curves = tuple(_curve(c, f"{w}: reliability[{i}]") for i, c in enumerate(_list(d["reliability"], w)))
    summary = None
    if d.get("summary") is not None:
        s = _obj(d["summary"], f"{w}: summary", ("before",), ("after",))
        summary = {k: _scores(v, f"{w}: summary.{k}") for k, v in s.items() if v is not None}
    return Calibration(source, _str(d["drafter"], w), _str(d["method"], w), tuple(positions), curves, summary,
                       *(_str(d.get(k), w, True) for k in ("target", "dataset", "note")))


@dataclass(frozen=True)
class LoadPoint:
    drafter: str
    source: str  # "measured" | "simulated"
    concurrency: int
    throughput_tok_s: float
    per_user_tps: float
    verify_budget: float | None


@dataclass(frozen=True)
class LoadSweep:
    source: Path
    points: tuple[LoadPoint, ...]
    target: str | None = None
    throughput_unit: str = "tok/s"
    note: str | None = None


def parse_load_sweep(data: Any, source: Path) -> LoadSweep:
    w = str(source)
    d = _obj(data, w, ("points",), ("target", "throughput_unit", "note"))
    keys = ("drafter", "source", "concurrency", "throughput_tok_s", "per_user_tps", "verify_budget")
    points = []
    for i, p in enumerate(_list(d["points"], w)):
        p = _obj(p, f"{w}: points[{i}]", keys)
        if p["source"] not in ("measured", "simulated"):
            raise ReportError(f"{w}: points[{i}].source must be 'measured' or 'simulated', got {p['source']!r}")
        points.append(LoadPoint(_str(p["drafter"], w), p["source"], _int(p["concurrency"], w),
                                _num(p["throughput_tok_s"], w), _num(p["per_user_tps"], w),
                                _num(p["verify_budget"], w, True)))
    return LoadSweep(source, tuple(points), _str(d.get("target"), w, True),
                     _str(d.get("throughput_unit", "tok/s"), w), _str(d.get("note"), w, True))


@dataclass(frozen=True)
class LosslessRow:
    test: str
    configuration: str
    n: int
    statistic: float | None
    p_value: float | None
    verdict: str
    is_control: bool


@dataclass(frozen=True)
class Lossless:
    source: Path
    rows: tuple[LosslessRow, ...]
    alpha: float | None = None
    note: str | None = None


def parse_lossless(data: Any, source: Path) -> Lossless:
    w = str(source)
    d = {"rows": data} if isinstance(data, list) else _obj(data, w, ("rows",), ("alpha", "note"))
    keys = ("test", "configuration", "n", "statistic", "p_value", "verdict", "is_control")
    rows = []
    for i, r in enumerate(_list(d["rows"], w)):
        r = _obj(r, f"{w}: rows[{i}]", keys)
        if not isinstance(r["is_control"], bool):
            raise ReportError(f"{w}: rows[{i}].is_control must be true or false, got {r['is_control']!r}")
        rows.append(LosslessRow(_str(r["test"], w), _str(r["configuration"], w), _int(r["n"], w),
                                _num(r["statistic"], w, True), _num(r["p_value"], w, True),
                                _str(r["verdict"], w), r["is_control"]))
    return Lossless(source, tuple(rows), _num(d.get("alpha"), w, True), _str(d.get("note"), w, True))


_PARSERS = {"profile": parse_profile, "sweep": parse_sweep, "calibration": parse_calibration,
            "concurrency": parse_load_sweep, "simulation": parse_load_sweep, "lossless": parse_lossless}


def read_artifact(path: Path):
    """Parse ``path`` by its file name (``<kind>.json``, kind one of :data:`KINDS`)."""
    kind = path.name.removesuffix(".json")
    if kind not in _PARSERS or not path.name.endswith(".json"):
        raise ReportError(f"{path}: not a report input; accepted file names: {', '.join(k + '.json' for k in KINDS)}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    return _PARSERS[kind](data, path)

"""Result files beside the runs, parsed into frozen dataclasses (unknown or missing keys are errors).

Each is found by its file name, inside a run folder, in a folder of its own, or named directly. The schemas are
those of the tools that write them; numbers are shown as recorded, never re-derived. Non-finite numbers may be
written as NaN or as the strings "nan"/"inf"; they are shown as missing.

``profile.json`` (``dspark-bench profile``, :mod:`dspark_bench.scheduling.profile`)::

    {"target", "dtype", "device", "machine", "context_lengths": [...], "batch_tokens": [...],
     "steps_per_s": [[...per batch_tokens...] per context length]}        # the first four optional here

``sweep.json`` (``dspark-bench sweep``, :mod:`dspark_bench.studies.sweep`): measured cells::

    {"spec": {...}, "profile": "...", "comparisons": [...],                 # optional
     "rows": [{"drafter", "scheduler", "label", "concurrency", "options": {"theta": 0.3, ...},
               "aggregate_tokens_per_s", "per_request_tps", "mean_verify_budget",
               "waste", "tau", "acceptance_rate", "accepted_per_step", "rejected_per_step",
               "verified_acceptance_rate", "n_requests", "n_errors", "folder", "domain"}]}

  Required per row: drafter, scheduler, label, concurrency, aggregate_tokens_per_s, per_request_tps,
  mean_verify_budget. Rows of scheduler ``threshold`` with ``options.theta`` make the threshold sweep
  (paper Figure 5); an optional ``domain`` splits it by domain (otherwise all prompts are pooled).
  A request-rate sweep's rows add ``request_rate`` and the serving numbers of
  :data:`dspark_bench.studies.serving_sweep.SERVING_ROW`, and the file an optional ``serving`` block (each method
  against ``none``: :func:`dspark_bench.studies.serving_sweep.compare`, as ``sweep`` writes it)::

    {"baseline", "tpot_slo_ms", "slo_ms", "methods": [{"method", "equal_throughput": [{"system", "per_user",
     "base_per_user", "ratio"}], "ratio_min", "ratio_max", "sustained": {"rate", "bound"} | null,
     "base_sustained": ..., "rate_ratio", "rate_ratio_kind"}]}

``simulate.json`` (``dspark-bench simulate``, :mod:`dspark_bench.studies.simulate`): SIMULATED cells, same row fields
(``drafter`` and ``label`` optional), plus optional top-level ``simulated``, ``note``, ``profile``,
``machine``, ``layout``, ``overhead``, ``traces``, ``validation``.

``calibration.json`` (``dspark-bench calibrate``, :mod:`dspark_bench.scheduling.calibration`)::

    {"source": {"drafter": ..., ...}, "summary": {"ece_before", "ece_after", "auroc_before", ...},
     "positions": [{"k", "n", "temperature", "before": {"ece", "auroc", "brier", "bins": [[mean_pred,
     mean_obs, count], ...]}, "after": {...}}]}                   # source, summary, n, temperature, after optional

``lossless.json`` (the lossless battery): ``{"rows": [...]}`` or the battery's full report
``{"mode", "target", "dtype", "seed", "alpha", "seconds", "ok", "results": [...]}``; a row has ``test``,
``configuration``, ``n``, ``statistic``, ``verdict``, ``is_control`` and optionally ``p_value``, ``bound``,
``expected``, ``adjusted_p``, ``df``, ``power_n``, ``detail``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_bench.evaluation.runs import read_json
from dspark_bench.studies.serving_sweep import SERVING_ROW

KINDS = ("profile", "sweep", "simulate", "calibration", "lossless")


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


def _num(value: Any, where: str) -> float | None:
    """A number; null, NaN, infinities and the strings "nan"/"inf" are None (shown as missing)."""
    if value is None or (isinstance(value, str) and value.strip("+-").lower() in ("nan", "inf", "infinity")):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReportError(f"{where}: expected a number, got {value!r:.40}")
    return float(value) if math.isfinite(value) else None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(f"{where}: expected an integer, got {value!r:.40}")
    return value


def _str(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ReportError(f"{where}: expected a string, got {value!r:.40}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Profile:
    source: Path
    context_lengths: tuple[int, ...]
    batch_tokens: tuple[int, ...]
    steps_per_s: tuple[tuple[float | None, ...], ...]  # [context length][batch tokens]
    where: str  # target, dtype, device, machine as recorded


def parse_profile(data: Any, source: Path) -> Profile:
    w = str(source)
    info = ("target", "dtype", "device", "machine", "note")
    d = _obj(data, w, ("context_lengths", "batch_tokens", "steps_per_s"),
             (*info, "verify", "draft", "overhead", "block_size"))  # the cost model's parts: not drawn here
    ctx = tuple(_int(v, f"{w}: context_lengths") for v in _list(d["context_lengths"], w))
    batch = tuple(_int(v, f"{w}: batch_tokens") for v in _list(d["batch_tokens"], w))
    sps = tuple(tuple(_num(v, f"{w}: steps_per_s") for v in _list(row, w)) for row in _list(d["steps_per_s"], w))
    if len(sps) != len(ctx) or any(len(row) != len(batch) for row in sps):
        raise ReportError(f"{w}: steps_per_s must have one row per context length ({len(ctx)}) "
                          f"of one value per batch_tokens entry ({len(batch)})")
    return Profile(source, ctx, batch, sps, ", ".join(str(d[k]) for k in info if d.get(k) not in (None, "", "-")))


ROW_REQUIRED = ("scheduler", "concurrency", "aggregate_tokens_per_s", "per_request_tps", "mean_verify_budget")
ROW_OPTIONAL = ("options", "waste", "tau", "acceptance_rate", "accepted_per_step", "rejected_per_step",
                "verified_acceptance_rate", "n_requests", "n_errors", "folder", "domain", "simulated", "layout",
                "clock_scale", "plain_clock_scale", "request_rate", *SERVING_ROW)
_ROW_NUMBERS = ("aggregate_tokens_per_s", "per_request_tps", "mean_verify_budget", "waste", "tau", "acceptance_rate",
                "accepted_per_step", "rejected_per_step", "verified_acceptance_rate", *SERVING_ROW)


@dataclass(frozen=True)
class CellRow:
    """One sweep or simulation cell: a drafter under a scheduler at a concurrency."""

    drafter: str
    label: str  # scheduler plus options, e.g. "threshold[theta=0.3]"
    scheduler: str
    concurrency: int
    simulated: bool
    theta: float | None
    domain: str | None
    numbers: Mapping[str, float | None]  # the _ROW_NUMBERS present, as recorded
    request_rate: float | None = None  # a request-rate cell (open-loop load); None: closed loop at concurrency


def _row(data: Any, where: str, simulated: bool) -> CellRow:
    required = ROW_REQUIRED if simulated else ("drafter", "label", *ROW_REQUIRED)
    d = _obj(data, where, required, ("drafter", "label", *ROW_OPTIONAL) if simulated else ROW_OPTIONAL)
    options = d.get("options") or {}
    if not isinstance(options, dict):
        raise ReportError(f"{where}.options: expected an object, got {options!r:.40}")
    theta = _num(options["theta"], f"{where}.options.theta") if "theta" in options else None
    return CellRow(_str(d.get("drafter"), where) or "(unnamed)", _str(d.get("label"), where) or d["scheduler"],
                   _str(d["scheduler"], where), _int(d["concurrency"], f"{where}.concurrency"), simulated, theta,
                   _str(d.get("domain"), where), {k: _num(d[k], f"{where}.{k}") for k in _ROW_NUMBERS if k in d},
                   _num(d.get("request_rate"), f"{where}.request_rate"))


@dataclass(frozen=True)
class MethodServing:
    """One method against the baseline in a request-rate sweep (numbers as recorded)."""

    method: str
    equal_throughput: tuple[tuple[float | None, float | None, float | None, float | None], ...]  # system, per_user,
    # base_per_user, ratio
    ratio_min: float | None
    ratio_max: float | None
    sustained: tuple[float | None, str] | None  # (rate, bound)
    base_sustained: tuple[float | None, str] | None
    rate_ratio: float | None
    rate_ratio_kind: str | None


@dataclass(frozen=True)
class ServingComparison:
    baseline: str
    tpot_slo_ms: float | None
    methods: tuple[MethodServing, ...]


@dataclass(frozen=True)
class Cells:
    source: Path
    rows: tuple[CellRow, ...]
    simulated: bool
    note: str | None = None
    serving: ServingComparison | None = None  # a request-rate sweep's comparisons


def _sustained(data: Any, where: str) -> tuple[float | None, str] | None:
    if data is None:
        return None
    d = _obj(data, where, ("rate", "bound"))
    return _num(d["rate"], f"{where}.rate"), _str(d["bound"], where) or ""


def _method_serving(data: Any, where: str) -> MethodServing:
    d = _obj(data, where, ("method", "equal_throughput", "ratio_min", "ratio_max", "sustained", "base_sustained",
                           "rate_ratio", "rate_ratio_kind"))
    keys = ("system", "per_user", "base_per_user", "ratio")
    equal = tuple(tuple(_num(_obj(e, f"{where}.equal_throughput[{i}]", keys)[k], f"{where}.equal_throughput[{i}]")
                        for k in keys) for i, e in enumerate(_list(d["equal_throughput"], where)))
    return MethodServing(_str(d["method"], where) or "", equal, _num(d["ratio_min"], where),
                         _num(d["ratio_max"], where), _sustained(d["sustained"], f"{where}.sustained"),
                         _sustained(d["base_sustained"], f"{where}.base_sustained"), _num(d["rate_ratio"], where),
                         _str(d["rate_ratio_kind"], where))


def _serving(data: Any, where: str) -> ServingComparison | None:
    if data is None:
        return None
    d = _obj(data, where, ("baseline", "methods"), ("tpot_slo_ms", "slo_ms"))
    methods = tuple(_method_serving(m, f"{where}.methods[{i}]") for i, m in enumerate(_list(d["methods"], where)))
    return ServingComparison(_str(d["baseline"], where) or "", _num(d.get("tpot_slo_ms"), where), methods)


def parse_sweep(data: Any, source: Path) -> Cells:
    d = _obj(data, str(source), ("rows",), ("spec", "profile", "comparisons", "serving"))
    rows = tuple(_row(r, f"{source}: rows[{i}]", False) for i, r in enumerate(_list(d["rows"], str(source))))
    return Cells(source, rows, False, serving=_serving(d.get("serving"), f"{source}: serving"))


def parse_simulate(data: Any, source: Path) -> Cells:
    extra = ("simulated", "note", "profile", "machine", "layout", "overhead", "clock_scale", "plain_clock_scale",
             "drafter", "traces", "validation", "verify_model")
    d = _obj(data, str(source), ("rows",), extra)
    rows = tuple(_row(r, f"{source}: rows[{i}]", True) for i, r in enumerate(_list(d["rows"], str(source))))
    return Cells(source, rows, True, _str(d.get("note"), str(source)))


@dataclass(frozen=True)
class Scores:
    ece: float | None
    auroc: float | None
    brier: float | None
    bins: tuple[tuple[float, float, float], ...]  # (mean_pred, mean_obs, count) per non-empty bin


@dataclass(frozen=True)
class CalibrationPosition:
    k: int
    n: int | None
    temperature: float | None
    before: Scores
    after: Scores | None


@dataclass(frozen=True)
class Calibration:
    source: Path
    drafter: str
    positions: tuple[CalibrationPosition, ...]
    summary: Mapping[str, float | None]  # e.g. ece_before, ece_after, auroc_before, ... as recorded
    origin: Mapping[str, Any]  # the file's "source" block (what it was fitted on), shown as text


def _scores(data: Any, where: str) -> Scores | None:
    if data is None:
        return None
    d = _obj(data, where, (), ("ece", "auroc", "brier", "bins"))
    bins = []
    for i, b in enumerate(_list(d.get("bins", []), f"{where}.bins")):
        if not isinstance(b, list) or len(b) != 3:
            raise ReportError(f"{where}.bins[{i}]: expected [mean_pred, mean_obs, count], got {b!r:.40}")
        bins.append(tuple(_num(x, f"{where}.bins[{i}]") for x in b))
    return Scores(*(_num(d.get(k), f"{where}.{k}") for k in ("ece", "auroc", "brier")), tuple(bins))


def _position(data: Any, where: str) -> CalibrationPosition:
    d = _obj(data, where, ("k", "before"), ("n", "temperature", "after"))
    n = _int(d["n"], f"{where}.n") if d.get("n") is not None else None
    return CalibrationPosition(_int(d["k"], f"{where}.k"), n, _num(d.get("temperature"), f"{where}.temperature"),
                               _scores(d["before"], f"{where}.before"), _scores(d.get("after"), f"{where}.after"))


def parse_calibration(data: Any, source: Path) -> Calibration:
    w = str(source)
    d = _obj(data, w, ("positions",), ("source", "summary"))
    positions = tuple(_position(p, f"{w}: positions[{i}]") for i, p in enumerate(_list(d["positions"], w)))
    origin = d.get("source") or {}
    summary = d.get("summary") or {}
    if not isinstance(origin, dict) or not isinstance(summary, dict):
        raise ReportError(f"{w}: 'source' and 'summary' must be objects")
    return Calibration(source, str(origin.get("drafter", "drafter")), positions,
                       {k: _num(v, f"{w}: summary.{k}") for k, v in summary.items()}, origin)


@dataclass(frozen=True)
class LosslessRow:
    test: str
    configuration: str
    n: int
    statistic: float | None
    p_value: float | None
    verdict: str
    is_control: bool
    expected: str  # the verdict a sound battery gives: "pass" for methods, "fail" for negative controls
    detail: str = ""


@dataclass(frozen=True)
class Lossless:
    source: Path
    rows: tuple[LosslessRow, ...]
    alpha: float | None = None


_LOSSLESS_OPTIONAL = ("p_value", "bound", "expected", "adjusted_p", "df", "power_n", "detail")


def _lossless_row(data: Any, where: str) -> LosslessRow:
    d = _obj(data, where, ("test", "configuration", "n", "statistic", "verdict", "is_control"), _LOSSLESS_OPTIONAL)
    if not isinstance(d["is_control"], bool):
        raise ReportError(f"{where}.is_control must be true or false, got {d['is_control']!r}")
    expected = d.get("expected") or ("fail" if d["is_control"] else "pass")
    return LosslessRow(_str(d["test"], where), _str(d["configuration"], where), _int(d["n"], f"{where}.n"),
                       _num(d["statistic"], f"{where}.statistic"), _num(d.get("p_value"), f"{where}.p_value"),
                       _str(d["verdict"], where), d["is_control"], expected, _str(d.get("detail"), where) or "")


def parse_lossless(data: Any, source: Path) -> Lossless:
    w = str(source)
    if isinstance(data, dict) and "results" in data:
        d = _obj(data, w, ("results",), ("mode", "target", "dtype", "seed", "alpha", "seconds", "ok"))
        rows = d["results"]
    else:
        d = _obj(data, w, ("rows",), ("alpha", "note"))
        rows = d["rows"]
    parsed = tuple(_lossless_row(r, f"{w}: rows[{i}]") for i, r in enumerate(_list(rows, w)))
    return Lossless(source, parsed, _num(d.get("alpha"), f"{w}: alpha"))


_PARSERS = {"profile": parse_profile, "sweep": parse_sweep, "simulate": parse_simulate,
            "calibration": parse_calibration, "lossless": parse_lossless}


def read_artifact(path: Path):
    """Parse ``path`` by its file name (``<kind>.json``, kind one of :data:`KINDS`)."""
    kind = path.name.removesuffix(".json")
    if kind not in _PARSERS or not path.name.endswith(".json"):
        raise ReportError(f"{path}: not a report input; accepted file names: {', '.join(k + '.json' for k in KINDS)}")
    data = read_json(path, f"the JSON object of a {path.name} (its schema: dspark_bench/report/inputs.py)", ReportError)
    return _PARSERS[kind](data, path)

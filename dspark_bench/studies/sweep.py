"""Experiments through the one engine: the concurrency x scheduler sweep, the static-threshold sweep (paper
Figure 5) and calibration rounds from held-out prompts. Every cell is a normal run folder written by
:class:`~dspark_bench.engines.native.runner.Run`; ``sweep.json`` rows are computed from those records.

Row fields (pooled over the cell's requests; acceptance metrics from :mod:`dspark_bench.evaluation.metrics`):

* ``aggregate_tokens_per_s`` = ``metrics.system_tokens_per_s``, ``per_request_tps`` =
  ``metrics.per_request_tokens_per_s`` (both defined in :mod:`dspark_bench.evaluation.metrics`);
* ``mean_verify_budget`` = 1 + ``mean_verified`` (tokens per request per step the target verifies, anchor
  included: MTP-1 is 2); ``waste``, ``tau``, ``acceptance_rate`` from ``metrics.acceptance``;
* Figure 5: ``accepted_per_step``, ``rejected_per_step`` and ``verified_acceptance_rate`` (:func:`figure5`);
* request-rate cells (``request_rates``): ``request_rate`` and the serving numbers of
  :data:`~dspark_bench.studies.serving_sweep.SERVING_ROW` (:mod:`dspark_bench.evaluation.serving`).

**Request-rate sweep** (``SweepSpec.request_rates``, the paper's serving view): the levels are offered request
rates instead of concurrencies. At each rate every cell decodes the same prompts on the same seeded arrival
schedule (open-loop load, at most ``max_concurrency`` in flight), the cells interleaved round by round, each on its
own clock (:mod:`dspark_bench.engines.native.runner`). ``sweep.json``'s ``serving`` block compares every method
with ``none`` (:mod:`dspark_bench.studies.serving_sweep`): per-user tokens/s at equal system throughput, and the
highest rate sustained under the TPOT SLO (``slo["tpot"]``) at p90.

**Held-out prompts** for calibration, two sources: :func:`heldout_prompts` (default), per dataset of the suite
the prompts that follow the first ``eval_limit`` of that dataset's seeded shuffle, disjoint from the evaluation
prompts of every run with ``--limit <= eval_limit`` and the same seed (checked by prompt id), so calibration
sees the evaluation distribution; or :func:`generated_prompts`, the training prompt generator under a seed the
trainer did not use (no evaluation text, no training text).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.arrivals import Arrivals
from dspark_bench.core.records import RequestRecord
from dspark_bench.drafters.checkpoint import shipped_folder
from dspark_bench.drafters.registry import make_config
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run, execute_together
from dspark_bench.evaluation.metrics import acceptance, count_rounds, system_tokens_per_s, tokens_per_s
from dspark_bench.evaluation.runs import read_records, write_json
from dspark_bench.evaluation.serving import serving_summary
from dspark_bench.evaluation.suites import Prompt, load_suite
from dspark_bench.scheduling.calibration import (
    calibration_report,
    fit_sts,
    rounds_from_records,
    save_calibration,
)
from dspark_bench.scheduling.schedulers import parse_scheduler
from dspark_bench.studies import serving_sweep
from dspark_bench.target.model import Target

SWEEP_JSON = "sweep.json"


# ---- metrics ------------------------------------------------------------------------------------------------
aggregate_tokens_per_s = system_tokens_per_s  # the sweep's name for metrics.system_tokens_per_s


def figure5(records: Sequence[RequestRecord], gamma: int) -> dict[str, float | None]:
    """Paper Figure 5: accepted_per_step = sum(accepted) / rounds, rejected_per_step = sum(verified -
    accepted) / rounds, verified_acceptance_rate = sum(accepted) / sum(verified) (= 1 - waste)."""
    c = count_rounds((x for r in records for x in r.rounds), gamma)
    return {"accepted_per_step": c.accepted / c.rounds if c.rounds else None,
            "rejected_per_step": (c.verified - c.accepted) / c.rounds if c.rounds else None,
            "verified_acceptance_rate": c.accepted / c.verified if c.verified else None}


def sweep_row(records: Sequence[RequestRecord], gamma: int) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    acc = acceptance(count_rounds((x for r in ok for x in r.rounds), gamma))
    budget = None if acc["mean_verified"] is None else 1 + acc["mean_verified"]
    return {"aggregate_tokens_per_s": aggregate_tokens_per_s(ok), "per_request_tps": tokens_per_s(ok),
            "mean_verify_budget": budget, "waste": acc["waste"], "tau": acc["tau"],
            "acceptance_rate": acc["acceptance_rate"], **figure5(ok, gamma),
            "n_requests": len(records), "n_errors": len(records) - len(ok)}


def serving_row(records: Sequence[RequestRecord], slo: dict[str, float]) -> dict[str, Any]:
    """A request-rate cell's serving numbers (:data:`~dspark_bench.studies.serving_sweep.SERVING_ROW`; goodput
    under ``slo``)."""
    block = serving_summary(records, slo or None) or {}
    return {k: block.get(k) for k in serving_sweep.SERVING_ROW}


def serving_block(rows: Sequence[dict], slo: dict[str, float],
                  baseline: str = serving_sweep.BASELINE) -> dict[str, Any]:
    """``sweep.json``'s ``serving``: every method against ``baseline`` (``none`` under ``fixed``; a server sweep's
    server without speculation) (:mod:`dspark_bench.studies.serving_sweep`)."""
    tpot = slo.get("tpot")
    found = serving_sweep.compare(serving_sweep.points_from_rows(rows), tpot, baseline)
    return {"baseline": baseline, "tpot_slo_ms": tpot, "slo_ms": dict(slo),
            "methods": [dataclasses.asdict(c) for c in found]}


# ---- cells ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepSpec:
    target: str = "smollm2-135m"
    drafters: tuple[str, ...] = ("dspark",)
    schedulers: tuple[str, ...] = ("fixed", "threshold", "hardware-aware", "async")  # NAME or NAME[KEY=VALUE,...]
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    scheduler_options: dict[str, dict[str, str]] = field(default_factory=dict)
    drafter_options: dict[str, dict[str, str]] = field(default_factory=dict)
    fixed_lengths: tuple[int, ...] = ()  # extra cells: fixed with at most L verified tokens
    thetas: tuple[float, ...] | None = None  # threshold sweep: one threshold cell per theta instead
    baselines: tuple[str, ...] = ("none", "mtp")  # run with `fixed` when usable (MTP-1 verifies 2 tokens)
    repeats: int = 1  # passes over the prompts (alternating cell order)
    suite: str = "all"
    limit: int | None = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0  # sampling filters of every cell (RunSpec's)
    top_k: int = 0
    min_p: float = 0.0
    block_size: int = 7
    seed: int = 980406
    dtype: str = "bf16"
    request_rates: tuple[float, ...] = ()  # open-loop levels (requests/s), in place of the concurrency levels
    burstiness: float = 1.0
    max_concurrency: int | None = None  # request-rate cells: requests in flight at most (None: no cap)
    slo: dict[str, float] = field(default_factory=dict)  # ms bounds on ttft / tpot / e2el: goodput, sustained rate

    def __post_init__(self) -> None:
        """Unknown drafter names and options, and request rates that open-loop load cannot take, fail here, before
        a target loads or a profile is measured."""
        for rate in self.request_rates:
            Arrivals(rate, self.burstiness)  # a rate <= 0, a bad burstiness
        if self.request_rates and self.repeats != 1:
            raise ValueError(f"a request-rate sweep sends each request once per cell: drop --repeats {self.repeats}")
        known = drafter_registry.names()
        for role, names in (("drafter", self.drafters), ("baseline", self.baselines)):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"unknown {role} {', '.join(unknown)}; accepted: a comma list of the drafters "
                                 f"{', '.join(known)}")
        for name, options in self.drafter_options.items():
            if name not in (*self.drafters, *self.baselines):
                raise ValueError(f"drafter options for {name}, which is neither a swept drafter "
                                 f"({', '.join(self.drafters)}) nor a baseline ({', '.join(self.baselines) or 'none'})")
            make_config(name, options)  # an unknown option


@dataclass(frozen=True)
class Cell:
    drafter: str
    scheduler: str
    concurrency: int  # request-rate cells: the cap on requests in flight (0: none)
    options: dict[str, Any] = field(default_factory=dict)
    request_rate: float | None = None  # None: closed loop at ``concurrency``

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return self.scheduler + (f"[{opts}]" if opts else "")

    @property
    def folder(self) -> str:
        label = re.sub(r"[^A-Za-z0-9.=@-]+", "_", self.label.replace("[", "@").replace("]", ""))
        level = f"r{self.request_rate:g}" if self.request_rate is not None else f"c{self.concurrency}"
        return f"{self.drafter}__{label}__{level}"


def levels(spec: SweepSpec) -> list[tuple[int, float | None]]:
    """(concurrency, request rate) of each level: the concurrency levels (closed loop), or the request rates."""
    if spec.request_rates:
        return [(spec.max_concurrency or 0, rate) for rate in spec.request_rates]
    return [(conc, None) for conc in spec.concurrency]


def sweep_cells(spec: SweepSpec) -> list[Cell]:
    """Levels outermost, so every concurrency level (or request rate) is finished before the next starts."""
    cells = []
    baselines = [b for b in spec.baselines if b not in spec.drafters and usable(b, spec)]
    for conc, rate in levels(spec):
        for drafter in spec.drafters:
            if spec.thetas is not None:
                cells += [Cell(drafter, "threshold", conc, {"theta": t}, rate) for t in spec.thetas]
                continue
            for item in spec.schedulers:
                name, inline = parse_scheduler(item)
                cells.append(Cell(drafter, name, conc, {**spec.scheduler_options.get(name, {}), **inline}, rate))
            cells += [Cell(drafter, "fixed", conc, {"length": n}, rate) for n in spec.fixed_lengths]
        cells += [Cell(b, "fixed", conc, {}, rate) for b in baselines]
    return cells


def usable(name: str, spec: SweepSpec) -> bool:
    """A registered drafter that needs no weights, has a shipped checkpoint for the target, or was given one."""
    if name not in drafter_registry.names():
        return False
    cls = drafter_registry.drafter_class(name)
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    return ("checkpoint" not in fields or bool(spec.drafter_options.get(name, {}).get("checkpoint"))
            or shipped_folder(spec.target, name) is not None)


def cell_run(cell: Cell, spec: SweepSpec, target: Target, prompts: Sequence[Prompt], folder: Path,
             profile: str | None = None, warmup: bool = True) -> Run:
    run_spec = RunSpec(target=spec.target, drafters=(cell.drafter,), drafter_options=spec.drafter_options,
                       scheduler=cell.scheduler, suite=spec.suite, limit=spec.limit,
                       max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
                       top_k=spec.top_k, min_p=spec.min_p, block_size=spec.block_size,
                       seed=spec.seed, dtype=spec.dtype, warmup=warmup,
                       scheduler_options=dict(cell.options), profile=profile, repeats=spec.repeats,
                       **_load(cell, spec))
    return Run(run_spec, target, prompts, folder)


def _load(cell: Cell, spec: SweepSpec) -> dict[str, Any]:
    """The RunSpec fields of a cell's load: closed loop at its concurrency, or its request rate."""
    if cell.request_rate is None:
        return {"concurrency": cell.concurrency}
    return {"request_rate": cell.request_rate, "burstiness": spec.burstiness,
            "max_concurrency": spec.max_concurrency, "slo": dict(spec.slo)}


def run_cell(cell: Cell, spec: SweepSpec, target: Target, prompts: Sequence[Prompt], folder: Path,
             profile: str | None = None, warmup: bool = True) -> list[RequestRecord]:
    cell_run(cell, spec, target, prompts, folder, profile, warmup).execute()
    return read_records(folder)


def read_cell(folder: str | Path) -> list[RequestRecord]:
    """All records of a sweep cell: every run folder under it (one per cell since continuous batching; older
    sweeps hold one per (repeat, chunk))."""
    parts = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    return [rec for part in parts for rec in read_records(part)]


def run_sweep(spec: SweepSpec, target: Target, prompts: Sequence[Prompt], out: str | Path,
              profile: str | None = None, on_cell: Callable[[dict], None] = lambda row: None) -> dict:
    """Run every cell on the same prompts and seeds; write and return ``sweep.json``.

    The cells of one concurrency level run together on a shared machine: each holds R requests in flight over
    all prompts (continuous batching), and the cells' engines advance one round each in turn
    (:func:`dspark_bench.engines.native.runner.execute_together`), so load drift hits every cell alike and no batch drains
    before its queue is empty. Each cell is one run folder ``cells/<cell>/run`` with ``spec.repeats`` repeats."""
    out, rows, cells = Path(out), [], sweep_cells(spec)
    for conc, rate in levels(spec):
        level = [c for c in cells if (c.concurrency, c.request_rate) == (conc, rate)]
        runs = [cell_run(c, spec, target, prompts, out / "cells" / c.folder / "run", profile) for c in level]
        execute_together(runs)
        for cell in level:
            recs = read_cell(out / "cells" / cell.folder)
            served = {} if rate is None else {"request_rate": rate, **serving_row(recs, spec.slo)}
            rows.append({"drafter": cell.drafter, "scheduler": cell.scheduler, "label": cell.label,
                         "concurrency": cell.concurrency, "options": cell.options,
                         **sweep_row(recs, spec.block_size), **served, "folder": f"cells/{cell.folder}"})
            on_cell(rows[-1])
        result = {"spec": dataclasses.asdict(spec), "profile": profile, "rows": rows,
                  "comparisons": comparisons(rows)}
        if spec.request_rates:
            result["serving"] = serving_block(rows, spec.slo)
        write_json(out / SWEEP_JSON, result)
    return result


def comparisons(rows: Sequence[dict]) -> list[dict]:
    """Per drafter and concurrency: each cell's aggregate throughput and waste relative to ``fixed``."""
    out = []
    for row in rows:
        base = next((b for b in rows if b["label"] == "fixed" and b["drafter"] == row["drafter"]
                     and b["concurrency"] == row["concurrency"]
                     and b.get("request_rate") == row.get("request_rate")), None)
        if base is None or row is base or not base["aggregate_tokens_per_s"]:
            continue
        out.append({"drafter": row["drafter"], "label": row["label"], "concurrency": row["concurrency"],
                    **({"request_rate": row["request_rate"]} if "request_rate" in row else {}),
                    "throughput_vs_fixed": (row["aggregate_tokens_per_s"] or 0) / base["aggregate_tokens_per_s"],
                    "waste": row["waste"], "fixed_waste": base["waste"]})
    return out


# ---- calibration rounds ---------------------------------------------------------------------------------------
def heldout_prompts(suite: str, n: int, eval_limit: int, seed: int) -> list[Prompt]:
    """Up to ``n`` prompts per dataset after the first ``eval_limit`` of its seeded shuffle (module docstring)."""
    if n < 1 or eval_limit < 1:
        raise ValueError(f"need n >= 1 and eval_limit >= 1, got {n}, {eval_limit}")
    evaluation = {(p.dataset, p.prompt_id) for p in load_suite(suite, eval_limit, seed)}
    held = [p for p in load_suite(suite, eval_limit + n, seed) if (p.dataset, p.prompt_id) not in evaluation]
    if not held:
        raise ValueError(f"suite {suite!r} has no prompts beyond the first {eval_limit} per dataset to hold out")
    return held


# The shipped drafters' training prompts: build_prompts(6144, 0) (data/smollm2/train-6k/manifest.json). Each
# domain's prompts are a prefix of a longer set's under the same seed, so this also covers the 4,000 of earlier
# recipes.
SHIPPED_TRAIN_N = 6144


def generated_prompts(n: int, seed: int, suite: str, eval_limit: int | None, eval_seed: int,
                      train_n: int = SHIPPED_TRAIN_N, train_seed: int = 0) -> list[Prompt]:
    """``n`` prompts from the training prompt generator (``dspark_bench.train.prompts``) under ``seed``, none
    colliding with the suite's evaluation prompts and none equal to a training prompt (``train_n`` prompts
    under ``train_seed``: the shipped drafters' training data). Datasets ``gen-<domain>``."""
    from dspark_bench.train.prompts import build_prompts

    if seed == train_seed:
        raise ValueError(f"seed {seed} is the training seed: calibration prompts must be held out from training")
    training = {t.text for t in build_prompts(train_n, train_seed)}
    candidates = build_prompts(2 * n, seed, exclude=[p.text for p in load_suite(suite, eval_limit, eval_seed)])
    kept = [t for t in candidates if t.text not in training][:n]
    return [Prompt(f"gen-{t.domain}", t.domain, t.id, i, t.text) for i, t in enumerate(kept)]


def calibrate(spec: SweepSpec, drafter: str, target: Target, prompts: Sequence[Prompt], out: str | Path,
              concurrency: int = 1) -> dict:
    """Record fixed-length rounds of ``drafter`` on held-out ``prompts`` (run folder ``out/rounds``), fit STS
    and write ``out/calibration.json``."""
    out = Path(out)
    records = run_cell(Cell(drafter, "fixed", concurrency), spec, target, prompts, out / "rounds")
    return calibrate_records(records, out / "calibration.json",
                             {"drafter": drafter, "rounds": str(out / "rounds"), "prompts": len(prompts),
                              "datasets": sorted({p.dataset for p in prompts}), "temperature": spec.temperature,
                              "block_size": spec.block_size})


def calibrate_records(records: Sequence[RequestRecord], path: str | Path, source: dict) -> dict:
    rounds = rounds_from_records(records)
    if rounds.confidence.shape[0] == 0:
        raise ValueError("no recorded round carries confidences: the drafter predicts none")
    report = calibration_report(rounds, fit_sts(rounds), source)
    save_calibration(report, path)
    return report

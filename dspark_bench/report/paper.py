"""The paper's Table 1 as data (``dspark_bench/report/table1.json``), its offline protocol, and our numbers beside it.

Protocol (reference section 3): nine benchmarks with fixed caps, seed 980406, temperature 1.0, 2048 new tokens,
block size 7, no scheduler. Prompts come from a folder of DeepSpec ``eval_datasets/<name>.jsonl`` files when
given; otherwise the benchmarks we ship (gsm8k, aime25, humaneval) are used, and our built-in ``chat`` prompts
stand in for MT-Bench, Alpaca and Arena-Hard, labelled as such and never compared number-to-number.
``paper table1`` records this plan as ``paper_table1.json`` in the run folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dspark_bench.report.inputs import ReportError, _obj
from dspark_bench.report.load import Entry, Inputs
from dspark_bench.report.style import fmt, fmt_ci, fmt_pct
from dspark_bench.report.table1 import PaperTable1, PaperTarget, load_table1
from dspark_bench.report.tables import Table, macro_mean, relative_gain

PLAN_FILE = "paper_table1.json"
BUILT_IN = ("gsm8k", "aime25", "humaneval")
CHAT_STAND_IN = "chat"
FILE_ALIASES = {"arena-hard-v2": ("arena-hard-v2", "arena-hard")}


# ---------------------------------------------------------------------------------------------------------
# Our numbers beside the paper's.


def _tau(e: Entry) -> float | None:
    return e.metrics.get("tau")


def _ours(inp: Inputs, target: str) -> dict[str, dict[str, Entry]]:
    """label -> dataset -> entry, for one target, drafters other than `none`."""
    out: dict[str, dict[str, Entry]] = {}
    for e in inp.select("dataset"):
        if e.target == target and e.drafter != "none":
            out.setdefault(inp.label(e), {})[e.name] = e
    return {lab: out[lab] for lab in inp.labels([e for d in out.values() for e in d.values()])}


def stand_in_notes(inp: Inputs) -> dict[str, str]:
    """dataset -> how its prompts were obtained, from the runs' paper_table1.json plans."""
    notes = {}
    for run in inp.runs:
        for row in read_plan(run.path) or ():
            if row.source == "stand-in":
                notes.setdefault(row.prompts_from, []).append(row.name)
    return {k: "built-in stand-in for " + ", ".join(v) for k, v in notes.items()}


def _dataset_rows(pt: PaperTarget | None, label: str, drafter: str,
                  entries: Mapping[str, Entry], notes: Mapping[str, str]) -> list[tuple[str, ...]]:
    rows = []
    for name, e in entries.items():
        ours = _tau(e)
        note = notes.get(name, "")
        row = [label, name, fmt(ours) + fmt_ci(e.metrics.get("tau_ci95"))]
        if pt is not None:
            theirs = pt.tau.get(drafter, {}).get(name)
            delta = None if ours is None or theirs is None else ours - theirs
            row += [fmt(theirs), fmt(delta, "+.2f"), fmt_pct(relative_gain(ours, theirs))]
            if not note and theirs is None:
                note = "not in the paper" if drafter not in pt.tau else "not a paper benchmark"
        rows.append((*row, note))
    return rows


def _macro_row(pt: PaperTarget | None, label: str, drafter: str, entries: Mapping[str, Entry]) -> tuple[str, ...]:
    """Macro average over the datasets both sides have (all of ours without a paper target)."""
    theirs_all = pt.tau.get(drafter, {}) if pt is not None else {}
    shared = [n for n in entries if pt is None or n in theirs_all]
    ours = macro_mean([_tau(entries[n]) for n in shared])
    name = f"macro ({len(shared)} datasets)"
    if pt is None:
        return (label, name, fmt(ours, ".3f"), "")
    theirs = macro_mean([theirs_all[n] for n in shared]) if shared else None
    delta = None if ours is None or theirs is None else ours - theirs
    note = f"paper macro over all 9: {fmt(pt.macro.get(drafter), '.3f')}" if drafter in pt.macro else ""
    return (label, name, fmt(ours, ".3f"), fmt(theirs, ".3f"), fmt(delta, "+.3f"), fmt_pct(relative_gain(ours, theirs)),
            note)


def comparison_table(inp: Inputs, target: str, table: PaperTable1) -> Table:
    """Our τ per dataset beside the paper's (with Δ = ours − paper) when ``target`` is one of the paper's."""
    pt = table.match(target)
    notes = stand_in_notes(inp)
    rows = []
    for label, entries in _ours(inp, target).items():
        drafter = next(iter(entries.values())).drafter
        rows += _dataset_rows(pt, label, drafter, entries, notes)
        rows.append(_macro_row(pt, label, drafter, entries))
    if pt is None:
        caption = (f"Target {target} is not one of the paper's (" + ", ".join(t.name for t in table.targets)
                   + "), so there is no paper column.")
        return Table(f"Table 1 protocol: {target}", ("drafter", "dataset", "ours τ [95% CI]", "note"), tuple(rows), caption)
    caption = (f"Paper: {table.source} Target {target} matched to the paper's {pt.name}. Δ = ours − paper; "
               "macro rows average only the datasets both sides have.")
    cols = ("drafter", "dataset", "ours τ [95% CI]", "paper τ", "Δ", "Δ %", "note")
    return Table(f"Ours vs the paper's Table 1: {pt.name}", cols, tuple(rows), caption)


def comparison_tables(inp: Inputs, with_plans: bool = True) -> list[Table] | str:
    """One table per target that is a paper target or was run with ``paper table1`` (then also the plan of where
    each benchmark's prompts came from); else why there is none."""
    table = load_table1()
    planned = {r.target for r in inp.runs if read_plan(r.path) is not None}
    targets = [t for t in dict.fromkeys(r.target for r in inp.runs) if table.match(t) or t in planned]
    if not targets:
        names = ", ".join(t.name for t in table.targets)
        return f"no run of a paper target ({names}) and no run made by `dspark-bench paper table1`"
    plans = [plan_table(p, r.name) for r in inp.runs if with_plans and (p := read_plan(r.path)) is not None]
    return [*(comparison_table(inp, t, table) for t in targets), *plans]


# ---------------------------------------------------------------------------------------------------------
# The offline protocol.


@dataclass(frozen=True)
class PlanRow:
    """How one paper benchmark's prompts were obtained: source is data-dir, built-in, stand-in or missing."""

    name: str
    domain: str
    source: str
    prompts_from: str  # file path, built-in dataset name, or "" when missing
    prompts: int


def _find_file(data_dir: Path | None, name: str) -> Path | None:
    if data_dir is None:
        return None
    return next((data_dir / f"{n}.jsonl" for n in FILE_ALIASES.get(name, (name,)) if (data_dir / f"{n}.jsonl").is_file()),
                None)


def resolve_prompts(names: Sequence[str], data_dir: Path | None, limit: int | None, seed: int) -> tuple[list, list[PlanRow]]:
    """Prompts of the paper's benchmarks ``names``, capped at min(paper cap, limit), and the plan that says whence."""
    from dspark_bench.evaluation.suites import load_dataset, load_jsonl

    table = load_table1()
    specs = {d.name: d for d in table.datasets}
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ReportError(f"unknown paper benchmark(s) {unknown}; known: {', '.join(specs)}")
    prompts, plan, chat_loaded = [], [], False
    for name in names:
        spec = specs[name]
        cap = spec.cap if limit is None else min(spec.cap, limit)
        path = _find_file(data_dir, name)
        if path is not None:
            got = load_jsonl(path, limit=cap, seed=seed, dataset=name, domain=spec.domain)
            plan.append(PlanRow(name, spec.domain, "data-dir", str(path), len(got)))
        elif name in BUILT_IN:
            got = load_dataset(name, limit=cap, seed=seed)
            plan.append(PlanRow(name, spec.domain, "built-in", name, len(got)))
        elif spec.domain == "chat":
            got = [] if chat_loaded else load_dataset(CHAT_STAND_IN, limit=limit, seed=seed)
            chat_loaded = True
            plan.append(PlanRow(name, spec.domain, "stand-in", CHAT_STAND_IN, len(got)))
        else:
            got = []
            plan.append(PlanRow(name, spec.domain, "missing", "", 0))
        prompts += got
    return prompts, plan


def write_plan(folder: Path, plan: Sequence[PlanRow]) -> None:
    (folder / PLAN_FILE).write_text(json.dumps({"protocol": "paper table1", "datasets": [asdict(r) for r in plan]},
                                               indent=2) + "\n", encoding="utf-8")


def read_plan(folder: Path) -> list[PlanRow] | None:
    path = Path(folder) / PLAN_FILE
    if not path.is_file():
        return None
    data = _obj(json.loads(path.read_text(encoding="utf-8")), str(path), ("protocol", "datasets"))
    fields = tuple(PlanRow.__dataclass_fields__)
    return [PlanRow(**_obj(r, f"{path}: datasets[{i}]", fields)) for i, r in enumerate(data["datasets"])]


def plan_table(plan: Sequence[PlanRow], run: str) -> Table:
    rows = tuple((r.name, r.domain, r.source, r.prompts_from or "–", str(r.prompts)) for r in plan)
    hint = ("Missing benchmarks need --data-dir with DeepSpec eval_datasets/<name>.jsonl files."
            if any(r.source in ("missing", "stand-in") for r in plan) else "")
    return Table(f"Where each benchmark's prompts came from: {run}", ("benchmark", "domain", "source", "prompts from", "n"),
                 rows, hint)

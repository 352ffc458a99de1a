"""What a report reads: run folders and the optional result files of :mod:`dspark_bench.report.inputs`.

A report input is a run folder (``manifest.json`` + ``summary.json``, or ``records.jsonl`` of a run that did not
finish), a folder of run folders, a folder holding only result files, or a result file named directly.
Numbers come from ``summary.json`` as recorded. Only a run without one (it stopped early) is re-aggregated,
from its records, by :func:`dspark_bench.evaluation.metrics.summarize`: the one definition of every metric.

Every summary group becomes an :class:`Entry`. Its *label* is the drafter name plus whatever else varies
across the report's inputs (target, scheduler, concurrency, the drafter's variant, block size γ, and the run when
two runs would otherwise share a label), so one label names one series in every table and figure. A drafter's
*variant* is the part of its recorded architecture (a loaded checkpoint's: layers, Markov head) and of its
variant options (``markov``, ``perturb``) that differs between the runs of that drafter, e.g. ``layers=1``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_bench.core.records import ResultsError
from dspark_bench.evaluation.runs import MANIFEST, RECORDS, SUMMARY, read_json, read_manifest
from dspark_bench.report.inputs import KINDS, ReportError, read_artifact
from dspark_bench.report.style import domain_sort_key, drafter_sort_key

VARIANT_FIELDS = ("target", "scheduler", "concurrency", "variant", "block_size", "run")
# What tells two drafters of one name apart (short names in labels); block_size has a field of its own.
ARCH_VARIANT = {"num_layers": "layers", "markov_rank": "rank", "markov_head_type": "head",
                "confidence_head": "confidence", "taps": "taps"}
OPTION_VARIANT = {"markov": "markov", "perturb": "perturb"}


@dataclass(frozen=True)
class RunData:
    """One run folder as recorded."""

    path: Path
    name: str
    manifest: Mapping[str, Any]
    summary: Mapping[str, Any]
    summary_source: str  # "summary.json", or how it was rebuilt

    @property
    def target(self) -> str:
        return str(self.manifest.get("target", {}).get("name") or self.manifest.get("args", {}).get("target", "?"))

    @property
    def block_size(self) -> int:
        return int(self.manifest.get("args", {}).get("block_size") or self.summary.get("gamma"))

    def git_states(self) -> tuple[tuple[str, str, bool | None], ...]:
        """(source, sha, dirty) of the code that recorded the run: the run itself, or each part of a merged run
        (``dspark-bench merge``). ``dirty``: tracked files had uncommitted changes; None: not recorded."""
        parts = self.manifest.get("parts") or []
        states = [(str(p.get("folder", "?")), p.get("git") or {}) for p in parts] if parts else \
            [(self.name, self.manifest.get("git") or {})]
        return tuple((src, str(g.get("sha") or "?"), g.get("dirty")) for src, g in states)

    def dirty_sources(self) -> tuple[str, ...]:
        """The sources (see :meth:`git_states`) recorded from a working tree with uncommitted changes."""
        return tuple(f"{Path(src).name} at {sha[:10]}" for src, sha, dirty in self.git_states() if dirty)

    def domains(self) -> dict[str, str]:
        """Dataset -> domain, from the manifest's prompt list."""
        return {p["dataset"]: p["domain"] for p in self.manifest.get("prompts", [])}


@dataclass(frozen=True)
class Entry:
    """One summary group (drafter x scheduler x concurrency, over one dataset, domain or all prompts)."""

    run: str
    target: str
    drafter: str
    scheduler: str
    concurrency: int
    block_size: int
    scope: str  # "dataset" | "domain" | "all"
    name: str  # dataset name, domain name, or "all"
    metrics: Mapping[str, Any] = field(hash=False, compare=False)
    variant: str = ""  # what sets this drafter apart from the same drafter in other runs (see the module doc)


@dataclass(frozen=True)
class Inputs:
    """Everything one report shows."""

    runs: tuple[RunData, ...]
    entries: tuple[Entry, ...]
    artifacts: Mapping[str, tuple[Any, ...]]  # kind -> parsed files (see inputs.KINDS)
    domains: Mapping[str, str]  # dataset -> domain
    varying: frozenset[str]  # which of VARIANT_FIELDS label the series

    def label(self, e: Entry, omit: Iterable[str] = ()) -> str:
        """Drafter name plus the fields that vary across the inputs (except ``omit``)."""
        parts = [e.drafter]
        shown = [f for f in VARIANT_FIELDS if f in self.varying and f not in set(omit)]
        for f in shown:
            value = getattr(e, f)
            parts.append({"block_size": f"γ={value}", "concurrency": f"c={value}"}.get(f, str(value)))
        return " · ".join(parts)

    def select(self, scope: str, name: str | None = None) -> list[Entry]:
        return [e for e in self.entries if e.scope == scope and (name is None or e.name == name)]

    def datasets(self) -> list[str]:
        """Dataset names, grouped by domain (math, code, chat, ...), first-seen order inside a domain."""
        names = list(dict.fromkeys(e.name for e in self.entries if e.scope == "dataset"))
        return sorted(names, key=lambda n: (domain_sort_key(self.domains.get(n, "custom")), names.index(n)))

    def labels(self, entries: Sequence[Entry], omit: Iterable[str] = ()) -> list[str]:
        """Distinct labels of ``entries``, drafters in canonical order."""
        firsts: dict[str, Entry] = {}
        for e in entries:
            firsts.setdefault(self.label(e, omit), e)
        return sorted(firsts, key=lambda lab: self.order(firsts[lab]))

    @staticmethod
    def order(e: Entry) -> tuple:
        """Canonical series order: drafter (none, ngram, mtp, eagle3, dflash, dspark, others), then variant values."""
        return (drafter_sort_key(e.drafter), e.target, e.scheduler, e.concurrency, e.variant, e.block_size, e.run)


def _summary(folder: Path, manifest: Mapping[str, Any]) -> tuple[dict, str]:
    if (folder / SUMMARY).is_file():
        accepted = (f"the {SUMMARY} that dspark-bench run writes (delete it to summarise the run from its "
                    f"{RECORDS})")
        return read_json(folder / SUMMARY, accepted, ReportError), SUMMARY
    from dspark_bench.evaluation.metrics import summarize
    from dspark_bench.evaluation.runs import read_records

    gamma = int(manifest.get("args", {}).get("block_size", 0))
    if gamma < 1:
        raise ReportError(f"{folder}: no {SUMMARY} and no block_size in {MANIFEST}; cannot summarise the records")
    return summarize(read_records(folder), gamma), f"{RECORDS} (no {SUMMARY}: run unfinished; metrics.summarize)"


def read_run(folder: Path, name: str | None = None) -> RunData:
    """A run folder as recorded; fails with a clear message when it is not one."""
    try:
        manifest = read_manifest(folder)
    except ResultsError as exc:
        raise ReportError(str(exc)) from None
    summary, source = _summary(folder, manifest)
    if not isinstance(summary.get("groups"), list):
        raise ReportError(f"{folder / SUMMARY}: expected an object with a 'groups' list (see metrics.summarize)")
    return RunData(folder, name or folder.name, manifest, summary, source)


def _is_run(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and ((folder / SUMMARY).is_file() or (folder / RECORDS).is_file())


def _artifact_files(folder: Path) -> list[Path]:
    return [folder / f"{k}.json" for k in KINDS if (folder / f"{k}.json").is_file()]


def _expand(path: Path) -> tuple[list[Path], list[Path]]:
    """(run folders, result files) that one command-line input stands for."""
    if path.is_file():
        return [], [path]
    if not path.is_dir():
        raise ReportError(f"{path}: no such file or folder")
    if _is_run(path):
        return [path], _artifact_files(path)
    runs = sorted(p for p in path.iterdir() if p.is_dir() and _is_run(p))
    files = _artifact_files(path) + [f for r in runs for f in _artifact_files(r)]
    if not runs and not files:
        raise ReportError(f"{path}: neither a run folder ({MANIFEST} + {SUMMARY} or {RECORDS}), a folder of run "
                          f"folders, nor a folder with any of {', '.join(k + '.json' for k in KINDS)}")
    return runs, files


def _unique_names(folders: Sequence[Path]) -> list[str]:
    names = [f.name for f in folders]
    return [f"{f.parent.name}/{f.name}" if names.count(f.name) > 1 else f.name for f in folders]


def _entries(run: RunData, variants: Mapping[tuple[str, str], str]) -> list[Entry]:
    return [Entry(run.name, run.target, g["drafter"], g.get("scheduler", "fixed"), int(g.get("concurrency", 1)),
                  run.block_size, g["scope"], g["name"], g, variants.get((run.name, g["drafter"]), ""))
            for g in run.summary["groups"]]


def _trait_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _traits(run: RunData, drafter: str) -> dict[str, str]:
    """A drafter's variant traits in one run: its recorded architecture and variant options, short-named."""
    info = run.manifest.get("drafters", {}).get(drafter) or {}
    arch, config = info.get("architecture") or {}, info.get("config") or {}
    out = {short: _trait_text(arch[k]) for k, short in ARCH_VARIANT.items() if k in arch}
    out.update({short: _trait_text(config[k]) for k, short in OPTION_VARIANT.items() if k in config})
    return out


def _variants(runs: Sequence[RunData]) -> dict[tuple[str, str], str]:
    """(run, drafter) -> the traits that differ between the runs of that drafter ("" when none do)."""
    traits = {(r.name, d): _traits(r, d) for r in runs for d in r.manifest.get("drafters", {})}
    out = {}
    for (run, drafter), mine in traits.items():
        others = [t for (_, d), t in traits.items() if d == drafter]
        differ = [k for k in mine if len({t.get(k) for t in others}) > 1]
        out[(run, drafter)] = " ".join(f"{k}={mine[k]}" for k in differ)
    return out


def _varying(entries: Sequence[Entry]) -> frozenset[str]:
    varying = {f for f in VARIANT_FIELDS[:-1] if len({getattr(e, f) for e in entries}) > 1}
    keys = [(e.drafter, e.scope, e.name, *(getattr(e, f) for f in sorted(varying))) for e in entries]
    if len(keys) != len(set(keys)):
        varying.add("run")  # the same configuration recorded by two runs: tell them apart by run
    return frozenset(varying)


def _known_domains() -> dict[str, str]:
    """Dataset -> domain for the datasets we ship and the paper's, for runs whose manifest lists no prompts."""
    from dspark_bench.evaluation.suites import SuiteError, datasets
    from dspark_bench.report.table1 import load_table1

    try:
        ours = {name: spec.domain for name, spec in datasets().items()}
    except (OSError, SuiteError):
        ours = {}
    return {**{d.name: d.domain for d in load_table1().datasets}, **ours}


def load_inputs(paths: Sequence[Path]) -> Inputs:
    """Read every input; duplicates are read once."""
    run_folders: list[Path] = []
    files: list[Path] = []
    for path in paths:
        runs, found = _expand(Path(path))
        run_folders += [r for r in runs if r.resolve() not in {x.resolve() for x in run_folders}]
        files += [f for f in found if f.resolve() not in {x.resolve() for x in files}]
    runs = tuple(read_run(f, n) for f, n in zip(run_folders, _unique_names(run_folders), strict=True))
    artifacts: dict[str, list[Any]] = {}
    for f in files:
        artifacts.setdefault(f.name.removesuffix(".json"), []).append(read_artifact(f))
    variants = _variants(runs)
    entries = tuple(e for r in runs for e in _entries(r, variants))
    domains = {**_known_domains(), **{d: dom for r in runs for d, dom in r.domains().items()}}
    return Inputs(runs, entries, {k: tuple(v) for k, v in artifacts.items()}, domains, _varying(entries))

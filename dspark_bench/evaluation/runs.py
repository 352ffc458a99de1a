"""On-disk results: ``results/<run>/manifest.json``, ``records.jsonl`` and ``summary.json``.

Records are appended and flushed one request at a time, so a crash mid-run loses nothing already written.
Files are parsed into frozen dataclasses at this edge; unknown keys are errors.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any

from dspark_bench.core.records import (
    RequestRecord,
    ResultsError,
    record_from_dict,
    record_key,
    record_to_dict,
)
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.target.allocator import host_allocator

SCHEMA_VERSION = 1
MANIFEST, RECORDS, SUMMARY = "manifest.json", "records.jsonl", "summary.json"


class RunWriter:
    """Creates a run folder, writes the manifest first and appends one record line per finished request."""

    def __init__(self, folder: str | Path, manifest: dict[str, Any], append: bool = False):
        """``append``: add to the records a run folder already holds (``run --resume``), rewriting its manifest."""
        self.folder = Path(folder)
        if (self.folder / RECORDS).exists() and not append:
            raise ResultsError(f"{self.folder} already holds a run; choose another --out")
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / MANIFEST, manifest)
        self._records = open(self.folder / RECORDS, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def add(self, rec: RequestRecord) -> None:
        self._records.write(json.dumps(record_to_dict(rec)) + "\n")
        self._records.flush()
        os.fsync(self._records.fileno())

    def close(self) -> None:
        self._records.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_json(path: str | Path, accepted: str, error: type[ValueError] = ResultsError) -> dict[str, Any]:
    """A JSON object from ``path``. A file that is not UTF-8, not JSON or not an object raises ``error`` with one
    line that names the file (and the line of a JSON error) and says what is ``accepted``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                    f"expected {accepted}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        why = "empty file" if not text.strip() else f"{exc.msg}: line {exc.lineno} column {exc.colno}"
        raise error(f"{path}: not valid JSON ({why}); expected {accepted}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: a JSON {type(data).__name__}, not an object; expected {accepted}")
    return data


def _records_text(folder: str | Path) -> tuple[Path, str]:
    """(the file, its text) of a run's ``records.jsonl`` or ``records.jsonl.gz``."""
    path = Path(folder) / RECORDS
    packed = path.with_name(RECORDS + ".gz")
    if path.is_file():
        data = path.read_bytes()
    elif packed.is_file():
        path = packed
        try:
            data = gzip.decompress(packed.read_bytes())
        except (OSError, EOFError, zlib.error) as exc:  # not gzip (OSError), truncated (EOFError), corrupt
            raise ResultsError(f"{path}: not a readable gzip file ({exc}); expected a gzip-compressed {RECORDS}, "
                               "one JSON record per line") from None
    else:
        raise ResultsError(f"{folder} has no {RECORDS} (or {RECORDS}.gz): is it a dspark-bench run folder?")
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ResultsError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); expected one JSON record "
                           "per line") from None


def read_records(folder: str | Path) -> list[RequestRecord]:
    """A run's records: ``records.jsonl``, or ``records.jsonl.gz`` as committed result sets store them."""
    path, text = _records_text(folder)
    out, seen = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = record_from_dict(json.loads(line))
        except (json.JSONDecodeError, ResultsError) as exc:
            raise ResultsError(f"{path}:{n}: {exc}") from None
        key = record_key(rec)
        if key in seen:
            raise ResultsError(f"{path}:{n}: drafter {rec.drafter}, dataset {rec.dataset}, prompt {rec.prompt_id}, "
                               f"repeat {rec.repeat} is already recorded on line {seen[key]}; a run holds one record "
                               f"per (drafter, dataset, prompt, repeat)")
        seen[key] = n
        out.append(rec)
    return out


def check_run_folders(roots: list[Path]) -> list[tuple[Path, str | None]]:
    """Every run folder (a folder holding ``records.jsonl`` or ``records.jsonl.gz``) under ``roots``, with None
    where :func:`read_records` reads it whole (one record per key, every line a valid record) and the error
    otherwise. A root that holds no run folder is an error of its own."""
    out = []
    for root in roots:
        folders = sorted({p.parent for p in Path(root).rglob(RECORDS + "*") if p.name in (RECORDS, RECORDS + ".gz")})
        if not folders:
            out.append((Path(root), f"no run folder (no {RECORDS} or {RECORDS}.gz) under {root}"))
        for folder in folders:
            try:
                error = None if read_records(folder) else f"{folder}: no record"
            except ResultsError as exc:
                error = str(exc)
            out.append((folder, error))
    return out


def drop_torn_tail(folder: str | Path) -> int:
    """Cut a last line of ``records.jsonl`` that a crash left half written (no newline, or not JSON), so the
    records before it can be read and resumed; returns the bytes cut (0 when the file ends cleanly)."""
    path = Path(folder) / RECORDS
    if not path.is_file():
        return 0
    data = path.read_bytes()
    end = data.rstrip(b"\n").rfind(b"\n") + 1  # start of the last non-empty line
    last = data[end:]
    if not last.strip():
        return 0
    try:
        json.loads(last.decode("utf-8"))
    except UnicodeDecodeError:  # records are written as ASCII JSON: not what a crash leaves, so not cut
        line = data[:end].count(b"\n") + 1
        raise ResultsError(f"{path}:{line}: not UTF-8 text; expected one JSON record per line") from None
    except json.JSONDecodeError:
        with open(path, "r+b") as f:
            f.truncate(end)
        return len(data) - end
    if not data.endswith(b"\n"):  # the whole record, all but its newline
        with open(path, "ab") as f:
            f.write(b"\n")
    return 0


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ResultsError(f"{folder} has no {MANIFEST}: is it a dspark-bench run folder?")
    data = read_json(path, f"the {MANIFEST} that dspark-bench run writes (a JSON object)")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema_version {data.get('schema_version')!r}, this version reads {SCHEMA_VERSION}")
    return data


def environment() -> dict[str, Any]:
    """Package versions, git sha and machine facts for the manifest."""
    versions = {}
    for pkg in ("dspark-bench", "torch", "transformers", "numpy", "scipy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    import torch

    machine = {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_1_5_15": load_average(),  # what else ran when it started: timings under load say so here
        "allocator": host_allocator(),  # the host allocator policy (allocator.py); None: the C library's own
        "cpu": cpu_features(),  # a kept machine can come back on another CPU; bf16 and fp32 timings depend on it
    }
    return {"versions": versions, "git": _git_state(), "machine": machine}


# The vector extensions that change which matmul kernels torch picks on a CPU (bf16 is 5x slower without them).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any] | None:
    """The CPU's model name and which of CPU_FLAGS it has, from a Linux /proc/cpuinfo; None where there is none."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}


def load_average() -> list[float] | None:
    """The machine's 1/5/15-minute load averages, where the OS reports them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git_state() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return {"sha": None, "dirty": None}
    return {"sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


# Settings that must agree for run parts to be one run (the prompts, limit and skip may differ).
MERGE_SAME = ("target", "drafters", "drafter_options", "scheduler", "scheduler_options", "profile", "max_new_tokens",
              "temperature", "top_p", "top_k", "min_p", "block_size", "seed", "dtype", "repeats", "concurrency",
              "truncate", "engine", "request_rate", "burstiness", "max_concurrency")
# What a manifest written before a setting existed means by its absence.
UNRECORDED = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}


def complete_prompts(manifest: dict[str, Any], records: list[RequestRecord]) -> list[dict[str, Any]]:
    """The manifest's prompts up to (not including) the first one without a record for every drafter and
    repeat. Every drafter's session admits the prompts in manifest order and keeps ``concurrency`` in flight
    (continuous batching), so a run stopped early also holds records of requests admitted after a long one
    that was still running: they are the quick finishers, and keeping them would bias the run toward short
    outputs. The complete prefix leaves no such bias."""
    args = manifest["args"]
    want = len(args["drafters"]) * int(args.get("repeats") or 1)
    have: dict[tuple[str, str], int] = {}
    for r in records:
        have[(r.dataset, r.prompt_id)] = have.get((r.dataset, r.prompt_id), 0) + 1
    kept = []
    for p in manifest["prompts"]:
        if have.get((p["dataset"], p["prompt_id"]), 0) < want:
            break
        kept.append(p)
    return kept


def merge_runs(parts: list[Path], out: Path, datasets: list[set[str] | None] | None = None) -> dict[str, Any]:
    """Join run folders that decoded disjoint prompts with the same settings (``run --skip`` extending a run) into
    one run folder: each prompt's records from the one part that contributes it, one manifest listing the parts, and a summary over all records
    (:func:`dspark_bench.evaluation.metrics.summarize`). Returns the summary. A part that stopped early contributes its complete
    prompts only (:func:`complete_prompts`); ``datasets[i]``, when given, keeps only those datasets of part i.
    A part's records of prompts it does not contribute (left-out datasets, an incomplete tail, also when another
    part decoded the same prompt) are dropped; what each part left out is counted in the manifest's ``parts``."""
    if len(parts) < 2:
        raise ResultsError(f"merge needs at least two run folders, got {len(parts)}")
    if (Path(out) / RECORDS).exists():
        raise ResultsError(f"{out} already holds a run; choose another output folder")
    datasets = datasets or [None] * len(parts)
    manifests = [read_manifest(p) for p in parts]
    _check_same_settings(parts, manifests)
    read = [read_records(p) for p in parts]
    kept = [_selected(part, m, recs, only) for part, m, recs, only in zip(parts, manifests, read, datasets, strict=True)]
    owner = _owners(parts, kept)
    records = [r for part, recs in zip(parts, read, strict=True) for r in recs
               if owner.get((r.dataset, r.prompt_id)) == part]  # the owning part's copy only
    first = manifests[0]["args"]
    merged = {**manifests[0], "prompts": [p for prompts in kept for p in prompts],
              "args": {**first, "limit": max((m["args"].get("limit") or 0) for m in manifests) or None,
                       "skip": min(m["args"].get("skip", 0) for m in manifests)},
              "parts": [{"folder": str(p), "datasets": sorted(only) if only else "all", "args": m["args"],
                         "started": m.get("started"), "finished": m.get("finished"), "git": m.get("git"),
                         "machine": m.get("machine"), "prompts": len(k), "prompts_left_out": len(m["prompts"]) - len(k),
                         "records_left_out": sum(owner.get((r.dataset, r.prompt_id)) != p for r in recs)}
                        for p, m, k, recs, only in zip(parts, manifests, kept, read, datasets, strict=True)]}
    cut = [t for part, m in zip(parts, manifests, strict=True) for t in m.get("truncated", [])
           if owner.get((t["dataset"], t["prompt_id"])) == part]  # as the records: the owning part's
    if cut:
        merged["truncated"] = cut
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / MANIFEST, merged)
    (out / RECORDS).write_text("".join(json.dumps(record_to_dict(r)) + "\n" for r in records), encoding="utf-8")
    summary = summarize(records, int(first["block_size"]))
    write_json(out / SUMMARY, summary)
    return summary


def _check_same_settings(parts: list[Path], manifests: list[dict[str, Any]]) -> None:
    first = manifests[0]["args"]
    for part, m in zip(parts[1:], manifests[1:], strict=True):
        differ = [k for k in MERGE_SAME if m["args"].get(k, UNRECORDED.get(k)) != first.get(k, UNRECORDED.get(k))]
        if differ:
            raise ResultsError(f"{part} differs from {parts[0]} in {', '.join(differ)}: only parts of one run "
                               f"(same settings, other prompts) can be merged")


def _selected(part: Path, manifest: dict[str, Any], records: list[RequestRecord],
              only: set[str] | None) -> list[dict[str, Any]]:
    """The part's prompts that the merge takes: its complete prompts, of the datasets in ``only`` (None: all)."""
    unknown = sorted((only or set()) - {p["dataset"] for p in manifest["prompts"]})
    if unknown:
        raise ResultsError(f"{part} decoded no dataset {', '.join(unknown)}; it has "
                           f"{', '.join(dict.fromkeys(p['dataset'] for p in manifest['prompts']))}")
    return [p for p in complete_prompts(manifest, records) if only is None or p["dataset"] in only]


def _owners(parts: list[Path], kept: list[list[dict[str, Any]]]) -> dict[tuple[str, str], Path]:
    """(dataset, prompt id) -> the part that contributes it; a prompt in two parts is an error."""
    owner: dict[tuple[str, str], Path] = {}
    for part, prompts in zip(parts, kept, strict=True):
        for p in prompts:
            key = (p["dataset"], p["prompt_id"])
            if key in owner:
                raise ResultsError(f"prompt {key[1]} is in both {owner[key]} and {part}: the parts must be disjoint")
            owner[key] = part
    return owner

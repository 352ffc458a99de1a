"""How well a profile's verify grid prices the forwards a sweep actually ran (``dspark-bench study verify-vs-profile
PROFILE.json SWEEP_FOLDER``): per fixed-length cell, the median recorded verify seconds of full rounds (every
request in flight) against the grid at those rows, the cell's block width and the rounds' median context.

Only cells whose verify width is known from their scheduler are priced: ``none`` (1 token), ``fixed`` (the block
size + 1) and ``fixed[length=L]`` (L + 1). A round's context is its request's prompt length plus the tokens
committed before it (the median over the cell's full rounds). Read this on a quiet machine's sweep only.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from dspark_bench.evaluation.runs import read_manifest, read_records
from dspark_bench.scheduling.profile import load_profile


def cell_width(name: str, block_size: int) -> int | None:
    """The verify width of a sweep cell folder name (``none__fixed__c8``, ``dspark__fixed@length=2__c8``)."""
    drafter, scheduler = name.split("__")[:2]
    if drafter == "none":
        return 1
    if scheduler == "fixed":
        return block_size + 1
    m = re.fullmatch(r"fixed@length=(\d+)", scheduler)
    return int(m.group(1)) + 1 if m else None


def full_rounds(run: Path) -> tuple[int, list[float], list[float]]:
    """(concurrency, verify seconds, context) of the rounds in which every request was in flight."""
    records = [r for r in read_records(run) if r.ok]
    c = records[0].concurrency
    verify, context = [], []
    for r in records:
        pos = r.prompt_len
        for rd, t, b in zip(r.rounds, r.timings, r.batch or (None,) * len(r.rounds), strict=True):
            if b == c:
                verify.append(t[1])
                context.append(pos)
            pos += rd[3]
    return c, verify, context


def priced_cells(profile_path: Path, sweep: Path) -> list[dict]:
    """One dict per priced cell (its folder name, R, width, full rounds, median context, median verify seconds,
    the profile's price and the ratio), in folder order."""
    profile = load_profile(profile_path)
    out = []
    for cell in sorted((Path(sweep) / "cells").iterdir()):
        run = cell / "run"
        width = cell_width(cell.name, int(read_manifest(run)["args"]["block_size"]))
        if width is None:
            continue
        c, verify, context = full_rounds(run)
        if not verify:
            continue
        seconds, ctx = statistics.median(verify), statistics.median(context)
        priced = float(profile.verify_seconds(c, width, ctx))
        out.append({"cell": cell.name, "concurrency": c, "width": width, "rounds": len(verify), "context": ctx,
                    "verify_s": seconds, "profile_s": priced, "ratio": seconds / priced})
    return out


def table(rows: list[dict]) -> str:
    """What ``dspark-bench study verify-vs-profile`` prints."""
    lines = ["| cell | R | width | rounds | context | verify ms | profile ms | measured / profile |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['cell']} | {r['concurrency']} | {r['width']} | {r['rounds']} | {r['context']:.0f} "
              f"| {1e3 * r['verify_s']:.1f} | {1e3 * r['profile_s']:.1f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"

"""How well a profile's verify grid prices the forwards a sweep actually ran: per fixed-length cell, the median
recorded verify seconds of full rounds (every request in flight) against the grid at those rows, the cell's block
width and the rounds' median context.

    python scripts/verify_vs_profile.py PROFILE.json SWEEP_FOLDER

Only cells whose verify width is known from their scheduler are priced: ``none`` (1 token), ``fixed`` (the block
size + 1) and ``fixed[length=L]`` (L + 1). A round's context is its request's prompt length plus the tokens
committed before it (the median over the cell's full rounds). Read this on a quiet machine's sweep only.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from dspark_bench.profile import load_profile
from dspark_bench.results import read_manifest, read_records


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("sweep", type=Path)
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    print("| cell | R | width | rounds | context | verify ms | profile ms | measured / profile |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for cell in sorted((args.sweep / "cells").iterdir()):
        run = cell / "run"
        width = cell_width(cell.name, int(read_manifest(run)["args"]["block_size"]))
        if width is None:
            continue
        c, verify, context = full_rounds(run)
        if not verify:
            continue
        seconds, ctx = statistics.median(verify), statistics.median(context)
        priced = float(profile.verify_seconds(c, width, ctx))
        print(f"| {cell.name} | {c} | {width} | {len(verify)} | {ctx:.0f} | {1e3 * seconds:.1f} | {1e3 * priced:.1f} "
              f"| {seconds / priced:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

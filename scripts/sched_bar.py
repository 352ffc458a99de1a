"""Issue 17's bar on a sweep: per concurrency R, system tokens/s of `none`, every fixed length and every other
scheduler cell, each scheduler's verify budget, and each non-fixed cell's throughput over max(`none`, best fixed
length) (the bar: >= 0.97 at every R). ``--per-repeat``: the ratio within each repeat of the cells' records
instead (a cell's engine and scheduler live through all its repeats, so repeat 0 holds what an adapting
scheduler spends on learning).

    python scripts/sched_bar.py SWEEP_FOLDER [--drafter dspark] [--per-repeat]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def bar_rows(sweep: dict, drafter: str) -> list[dict]:
    """One dict per R: ``tps`` (label -> system tokens/s), ``budget`` (label -> mean verify budget), ``ratio``
    (non-fixed label -> its tokens/s over the best of `none` and the fixed lengths)."""
    out = []
    for r in sorted({row["concurrency"] for row in sweep["rows"]}):
        cells = [row for row in sweep["rows"] if row["concurrency"] == r]
        tps = {("none" if row["drafter"] == "none" else row["label"]): row["aggregate_tokens_per_s"] for row in cells
               if row["drafter"] in ("none", drafter)}
        budget = {row["label"]: row["mean_verify_budget"] for row in cells if row["drafter"] == drafter}
        best, ratio = _over_best(tps)
        out.append({"concurrency": r, "tps": tps, "budget": budget, "best": best, "ratio": ratio})
    return out


def repeat_ratios(folder: Path, drafter: str) -> dict[tuple[int, int], dict[str, float]]:
    """(R, repeat) -> non-fixed label -> its system tokens/s over the best of `none` and the fixed lengths, from
    the records of the sweep's cells."""
    from dspark_bench.metrics import system_tokens_per_s
    from dspark_bench.sweep import read_cell

    sweep = json.loads((folder / "sweep.json").read_text())
    tps: dict[tuple[int, int], dict[str, float]] = {}
    for row in sweep["rows"]:
        if row["drafter"] not in ("none", drafter):
            continue
        label = "none" if row["drafter"] == "none" else row["label"]
        records = [r for r in read_cell(folder / row["folder"]) if r.ok]
        for k in sorted({r.repeat for r in records}):
            tps.setdefault((row["concurrency"], k), {})[label] = system_tokens_per_s(
                [r for r in records if r.repeat == k])
    return {key: _over_best(cells)[1] for key, cells in sorted(tps.items())}


def _over_best(tps: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The best tokens/s of `none` and the fixed lengths, and every other label's tokens/s over it."""
    best = max(v for k, v in tps.items() if k == "none" or k.startswith("fixed"))
    return best, {k: v / best for k, v in tps.items() if k != "none" and not k.startswith("fixed")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--per-repeat", action="store_true")
    args = ap.parse_args(argv)
    if args.per_repeat:
        ratios = repeat_ratios(args.sweep, args.drafter)
        labels = list(dict.fromkeys(k for row in ratios.values() for k in row))
        print("| R | repeat | " + " | ".join(f"`{k}` / best" for k in labels) + " |")
        print("|---:|---:|" + "---:|" * len(labels))
        for (r, k), row in ratios.items():
            print(f"| {r} | {k} | " + " | ".join(f"{row[x]:.3f}" if x in row else "–" for x in labels) + " |")
        return 0
    rows = bar_rows(json.loads((args.sweep / "sweep.json").read_text()), args.drafter)
    labels = list(dict.fromkeys(k for row in rows for k in row["tps"]))
    others = list(dict.fromkeys(k for row in rows for k in row["ratio"]))
    print("| R | " + " | ".join(f"`{k}`" for k in labels) + " | " +
          " | ".join(f"`{k}` budget | `{k}` / best" for k in others) + " |")
    print("|---:|" + "---:|" * (len(labels) + 2 * len(others)))
    for row in rows:
        cells = [f"{row['tps'][k]:.2f}" if k in row["tps"] else "–" for k in labels]
        for k in others:
            b = row["budget"].get(k)
            cells += ["–" if b is None else f"{b:.2f}", f"{row['ratio'][k]:.3f}" if k in row["ratio"] else "–"]
        print(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 17's bar on a sweep: per concurrency R, system tokens/s of `none`, every fixed length and every other
scheduler cell, each scheduler's verify budget, and each non-fixed cell's throughput over max(`none`, best fixed
length) (the bar: >= 0.97 at every R).

    python scripts/sched_bar.py SWEEP_FOLDER [--drafter dspark]
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
        best = max(v for k, v in tps.items() if k == "none" or k.startswith("fixed"))
        ratio = {k: v / best for k, v in tps.items() if k != "none" and not k.startswith("fixed")}
        out.append({"concurrency": r, "tps": tps, "budget": budget, "best": best, "ratio": ratio})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--drafter", default="dspark")
    args = ap.parse_args(argv)
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

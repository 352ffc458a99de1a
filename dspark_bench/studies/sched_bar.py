"""The scheduling study's bar on a sweep (``dspark-bench study sched-bar SWEEP_FOLDER [--drafter dspark]
[--per-repeat]``): per concurrency R, system tokens/s of `none`, every fixed length and every other scheduler cell,
each scheduler's verify budget, and each non-fixed cell's throughput over max(`none`, best fixed length) (the bar:
>= 0.97 at every R). ``--per-repeat``: the ratio within each repeat of the cells' records instead (a cell's engine
and scheduler live through all its repeats, so repeat 0 holds what an adapting scheduler spends on learning).
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark_bench.evaluation.metrics import system_tokens_per_s
from dspark_bench.studies.sweep import read_cell


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


def bar_table(folder: Path, drafter: str = "dspark") -> str:
    """What ``dspark-bench study sched-bar`` prints: :func:`bar_rows` of the sweep's sweep.json as a markdown table."""
    rows = bar_rows(json.loads((Path(folder) / "sweep.json").read_text()), drafter)
    labels = list(dict.fromkeys(k for row in rows for k in row["tps"]))
    others = list(dict.fromkeys(k for row in rows for k in row["ratio"]))
    lines = ["| R | " + " | ".join(f"`{k}`" for k in labels) + " | " +
             " | ".join(f"`{k}` budget | `{k}` / best" for k in others) + " |",
             "|---:|" + "---:|" * (len(labels) + 2 * len(others))]
    for row in rows:
        cells = [f"{row['tps'][k]:.2f}" if k in row["tps"] else "–" for k in labels]
        for k in others:
            b = row["budget"].get(k)
            cells += ["–" if b is None else f"{b:.2f}", f"{row['ratio'][k]:.3f}" if k in row["ratio"] else "–"]
        lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def repeat_table(folder: Path, drafter: str = "dspark") -> str:
    """What ``dspark-bench study sched-bar --per-repeat`` prints: :func:`repeat_ratios` as a markdown table."""
    ratios = repeat_ratios(Path(folder), drafter)
    labels = list(dict.fromkeys(k for row in ratios.values() for k in row))
    lines = ["| R | repeat | " + " | ".join(f"`{k}` / best" for k in labels) + " |",
             "|---:|---:|" + "---:|" * len(labels)]
    for (r, k), row in ratios.items():
        lines.append(f"| {r} | {k} | " + " | ".join(f"{row[x]:.3f}" if x in row else "–" for x in labels) + " |")
    return "\n".join(lines) + "\n"

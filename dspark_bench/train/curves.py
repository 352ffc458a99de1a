"""Training curves of drafter runs, in windows, and whether they have flattened: the stopping rule of the drafters'
training recipe (``dspark-bench study train-curves RUN [RUN ...] [--windows 10] [--json OUT]``).

RUN: a `dspark-bench train --out` folder (its train_log.jsonl, or .gz). For each run: the training tau (the
expected accepted length implied by the logged analytic acceptance) and position-1 acceptance averaged over equal
windows of the steps logged so far, the seconds per step (median), and the flatness verdict on quarters of the steps:

* gain_q4: mean tau of the last quarter over the third quarter, minus 1; gain_q3: third over second, minus 1.

A curve counts as **flat** when gain_q4 < 1%. With the cosine schedule the last quarter runs at under 15% of the
peak learning rate, so a curve that still rises by 1% or more there was still learning, and more steps would pay;
one that rises less has stopped improving at this schedule (the low rate is part of why, so read gain_q3 too: a
large gain_q3 means the rise ended with the rate, not with what the data can teach). The last-window gain alone
would call the shipped 480-step runs flat, though they rose 5% over their last quarter. A run still in progress is
judged on its steps so far and marked as such.

Training tau is measured on the step's own training sequences (seen again every epoch) and, with a reduced draft
vocabulary, conditional on the target's token being in the list. A run trained with ``--heldout`` also logs the
exact teacher-forced acceptance on sequences it never trains on (``heldout`` in its log lines, see
``dspark_bench/train/heldout.py``); then the report adds the held-out tau at each scored step and judges the rule on
it too: **heldout gain** is the last held-out tau over the one scored at or before three quarters of the last step,
minus 1, and the run is **flat (held-out)** when that is below 1%.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

FLAT_GAIN = 0.01  # gain_q4 below this: flat


class CurvesError(ValueError):
    """A run folder whose training log cannot be judged."""


def read_log(folder: Path) -> list[dict]:
    """The logged steps of a run (train_log.jsonl, or the train_log.jsonl.gz of a committed ablation run)."""
    path, packed = folder / "train_log.jsonl", folder / "train_log.jsonl.gz"
    if path.is_file():
        text = path.read_text()
    elif packed.is_file():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        raise CurvesError(f"{folder}: no train_log.jsonl (give a `dspark-bench train --out` folder)")
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a stop mid-write: the steps before it are whole
            break
    return rows


def planned_steps(folder: Path) -> int | None:
    config = folder / "train_config.json"
    return json.loads(config.read_text()).get("steps") if config.is_file() else None


def curves(folder: Path, windows: int = 10) -> dict:
    """One run's curve in ``windows`` equal windows of its logged steps, and the verdicts (module docstring)."""
    if windows < 2:
        raise CurvesError("--windows must be at least 2")
    rows = read_log(folder)
    if len(rows) < max(2 * windows, 8):
        raise CurvesError(f"{folder}: {len(rows)} steps logged, too few for {windows} windows and 4 quarters")
    size = len(rows) // windows
    parts = [rows[i * size : (i + 1) * size] for i in range(windows)]
    tau = [statistics.fmean(r["tau"] for r in part) for part in parts]
    first = [statistics.fmean(r["acceptance"][0] for r in part) for part in parts]
    quarter = len(rows) // 4
    q = [statistics.fmean(r["tau"] for r in rows[i * quarter : (i + 1) * quarter]) for i in range(4)]
    planned = planned_steps(folder)
    held = [{"step": r["step"], "tau": r["heldout"]["tau"], "first_position": r["heldout"]["acceptance"][0]}
            for r in rows if r.get("heldout")]
    held_gain = None
    if len(held) >= 2:
        earlier = [h for h in held if h["step"] <= 0.75 * held[-1]["step"]]
        if earlier:
            held_gain = held[-1]["tau"] / earlier[-1]["tau"] - 1
    return {
        "heldout": held, "heldout_gain": held_gain,
        "heldout_flat": None if held_gain is None else held_gain < FLAT_GAIN,
        "run": str(folder), "steps": rows[-1]["step"], "planned_steps": planned,
        "complete": planned is not None and rows[-1]["step"] >= planned,
        "window_steps": size, "tau": tau, "first_position": first,
        "seconds_per_step": statistics.median(r["seconds"] for r in rows),
        "tau_quarters": q, "gain_q3": q[2] / q[1] - 1, "gain_q4": q[3] / q[2] - 1,
        "flat": q[3] / q[2] - 1 < FLAT_GAIN,
    }


def table(results: list[dict]) -> str:
    """What ``dspark-bench study train-curves`` prints for :func:`curves` of each run."""
    windows = len(results[0]["tau"])
    head = "| run | steps | s/step | " + " | ".join(f"w{i + 1}" for i in range(windows)) + " | gain Q3 | gain Q4 | flat |"
    lines = [head, "|" + "---|" * (windows + 6)]
    for r in results:
        steps = f"{r['steps']}" + ("" if r["complete"] else f" of {r['planned_steps'] or '?'}")
        taus = " | ".join(f"{t:.3f}" for t in r["tau"])
        lines.append(f"| {Path(r['run']).name} | {steps} | {r['seconds_per_step']:.2f} | {taus} | "
                     f"{r['gain_q3']:+.1%} | {r['gain_q4']:+.1%} | {'yes' if r['flat'] else 'no'} |")
    lines.append("")
    lines.append("Position-1 acceptance by window: " + "; ".join(
        f"{Path(r['run']).name} " + " ".join(f"{a:.2f}" for a in r["first_position"]) for r in results))
    for r in results:
        if r["heldout"]:
            points = ", ".join(f"{h['step']}: {h['tau']:.3f}" for h in r["heldout"])
            verdict = ("too few scored steps to judge" if r["heldout_gain"] is None else
                       f"gain {r['heldout_gain']:+.1%}, {'flat' if r['heldout_flat'] else 'not flat'} (held-out)")
            lines.append(f"Held-out tau of {Path(r['run']).name} by step: {points}; {verdict}")
    return "\n".join(lines)

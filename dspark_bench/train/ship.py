"""Copy trained drafters into the shipped layout, weights in bf16 (what `run` loads by name for the target):
``dspark-bench ship-drafters RUNS DEST METHOD[=RUN_NAME] ...``, e.g.
``dspark-bench ship-drafters runs/smollm2 dspark_bench/drafters/shipped/smollm2-135m dspark dflash eagle3 mtp``.

RUNS/RUN_NAME/final (written by `dspark-bench train`) -> DEST/METHOD/{model.safetensors, config.json}. The
training log's last line is kept beside them as train_summary.json so the shipped folder says how it was made.
A calibration.json already in DEST/METHOD was fitted on the weights being replaced: it is removed (and the command
says so), because confidence schedulers would otherwise pick it up; fit a new one with `dspark-bench calibrate`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path


class ShipError(ValueError):
    """A training run without a finished checkpoint."""


@dataclass(frozen=True)
class Shipped:
    """What :func:`ship` wrote: the weights' size in bytes, and the stale calibration it removed (or None)."""

    size: int
    removed_calibration: Path | None


def ship(run: Path, dest: Path) -> Shipped:
    """RUN/final -> DEST (bf16 floating-point weights, integer tensors as they are, config.json,
    train_summary.json from RUN/train_log.jsonl)."""
    import torch
    from safetensors.torch import load_file, save_file

    final = run / "final"
    if not (final / "model.safetensors").is_file() or not (final / "config.json").is_file():
        raise ShipError(f"{final} has no finished checkpoint (model.safetensors + config.json)")
    state = load_file(str(final / "model.safetensors"))
    dest.mkdir(parents=True, exist_ok=True)
    stale = dest / "calibration.json"
    removed = None
    if stale.is_file():
        stale.unlink()
        removed = stale
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()},
              str(dest / "model.safetensors"))
    shutil.copyfile(final / "config.json", dest / "config.json")
    log = run / "train_log.jsonl"
    if log.is_file():
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        summary = {"run": str(run), "steps": len(lines), "last": json.loads(lines[-1]) if lines else None}
        (dest / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return Shipped((dest / "model.safetensors").stat().st_size, removed)


def ship_methods(runs: Path, dest: Path, items: list[str], say=print) -> int:
    """Ship each ``METHOD[=RUN_NAME]`` of ``items`` from RUNS/(RUN_NAME or METHOD) to DEST/METHOD; ``say`` gets one
    line per method (and per removed calibration) and the total. Returns the total size in bytes."""
    total = 0
    for item in items:
        method, _, name = item.partition("=")
        done = ship(runs / (name or method), dest / method)
        if done.removed_calibration is not None:
            say(f"removed {done.removed_calibration}: it was fitted on the replaced weights "
                "(re-fit it with `dspark-bench calibrate`)")
        total += done.size
        say(f"{method}: {done.size / 1e6:.1f} MB from {runs / (name or method)}")
    say(f"total {total / 1e6:.1f} MB in {dest}")
    return total

"""Copy trained drafters into the shipped layout, weights in bf16 (what `run` loads by name for the target).

    python scripts/ship_drafters.py RUNS DEST METHOD[=RUN_NAME] ...
    python scripts/ship_drafters.py runs/smollm2 baselines/drafters/smollm2-135m dspark dflash eagle3 mtp

RUNS/RUN_NAME/final (written by `dspark-bench train`) -> DEST/METHOD/{model.safetensors, config.json}. The
training log's last line is kept beside them as train_summary.json so the shipped folder says how it was made.
A calibration.json already in DEST/METHOD was fitted on the weights being replaced: it is removed (and the script
says so), because confidence schedulers would otherwise pick it up; fit a new one with `dspark-bench calibrate`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def ship(run: Path, dest: Path) -> int:
    final = run / "final"
    if not (final / "model.safetensors").is_file() or not (final / "config.json").is_file():
        raise SystemExit(f"error: {final} has no finished checkpoint (model.safetensors + config.json)")
    state = load_file(str(final / "model.safetensors"))
    dest.mkdir(parents=True, exist_ok=True)
    stale = dest / "calibration.json"
    if stale.is_file():
        stale.unlink()
        print(f"removed {stale}: it was fitted on the replaced weights (re-fit it with `dspark-bench calibrate`)")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()},
              str(dest / "model.safetensors"))
    shutil.copyfile(final / "config.json", dest / "config.json")
    log = run / "train_log.jsonl"
    if log.is_file():
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        summary = {"run": str(run), "steps": len(lines), "last": json.loads(lines[-1]) if lines else None}
        (dest / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return (dest / "model.safetensors").stat().st_size


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    runs, dest = Path(argv[0]), Path(argv[1])
    total = 0
    for item in argv[2:]:
        method, _, name = item.partition("=")
        size = ship(runs / (name or method), dest / method)
        total += size
        print(f"{method}: {size / 1e6:.1f} MB from {runs / (name or method)}")
    print(f"total {total / 1e6:.1f} MB in {dest}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""How wide the gate's tau statistics spread on unchanged drafters (baselines/smollm2-gate/power.md, "Why the rule
changed"): for each sampled run of FRESH (one seed each) and each drafter x scope, log(tau ratio) over its standard
error, the variance measured across the baseline's seeds (gate.seed_interval's delta method). Prints the mean and
spread of these statistics per domain and pooled, and the share below -2 (2.3% for a standard normal).

    python scripts/gate_tstat_spread.py [BASE_RUNS_GLOB] [FRESH_GLOB]
    (defaults: baselines/smollm2-gate/power-2026-12-03-base/*/t1,
               baselines/smollm2-gate/power-2026-12-03/fresh/same-*/t1)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from dspark_bench.gate import snapshot


def statistics(bases: list[dict], fresh: list[dict]) -> dict[str, list[float]]:
    k = len(bases)
    out: dict[str, list[float]] = {}
    for name in bases[0]["drafters"]:
        if name == "none":
            continue
        for dom in [*bases[0]["drafters"][name]["domains"], "all"]:
            def get(snap, dom=dom, name=name):
                doms = snap["drafters"][name]["domains"]
                return doms[dom] if dom != "all" else {key: v for p in doms.values() for key, v in p.items()}
            keys = sorted(get(bases[0]))
            x = np.array([[get(b)[key] for key in keys] for b in bases], float)  # [K, n, 2]
            c1, r1 = x[:, :, 0].sum() / k, x[:, :, 1].sum() / k
            var = float((x[:, :, 0] / c1 - x[:, :, 1] / r1).var(axis=0, ddof=1).sum()) * (1 + 1 / k)
            for snap in fresh:
                n = np.array([get(snap)[key] for key in keys], float)
                ratio = (n[:, 0].sum() / n[:, 1].sum()) / (c1 / r1)
                out.setdefault("all" if dom == "all" else "domains", []).append(math.log(ratio) / math.sqrt(var))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    base_glob = argv[0] if argv else "baselines/smollm2-gate/power-2026-12-03-base/*/t1"
    fresh_glob = argv[1] if len(argv) > 1 else "baselines/smollm2-gate/power-2026-12-03/fresh/same-*/t1"
    bases = [snapshot([p]) for p in sorted(Path().glob(base_glob))]
    fresh = [snapshot([p]) for p in sorted(Path().glob(fresh_glob))]
    print(f"{len(bases)} baseline seeds, {len(fresh)} fresh runs")
    for scope, z in statistics(bases, fresh).items():
        z = np.array(z)
        print(f"{scope}: {len(z)} statistics, mean {z.mean():.2f}, spread (sd) {z.std(ddof=1):.2f}, "
              f"below -2: {(z < -2).mean():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How wide the gate's tau statistics spread on unchanged drafters (baselines/smollm2-gate/power.md, "Why the rule
changed"; ``dspark-bench study gate-tstat-spread [BASE_RUNS_GLOB] [FRESH_GLOB]``): for each sampled run of FRESH (one seed
each) and each drafter x scope, log(tau ratio) over its standard error, the variance measured across the
baseline's seeds (:func:`dspark_bench.evaluation.gate.seed_interval`'s delta method). The command prints the mean
and spread of these statistics per domain and pooled, and the share below -2 (2.3% for a standard normal).
"""

from __future__ import annotations

import glob
import math
from pathlib import Path

import numpy as np

BASE_GLOB = "baselines/smollm2-gate/power-2026-12-03-base/*/t1"
FRESH_GLOB = "baselines/smollm2-gate/power-2026-12-03/fresh/same-*/t1"


def statistics(bases: list[dict], fresh: list[dict]) -> dict[str, list[float]]:
    """``{"domains": [...], "all": [...]}``: the statistic of every fresh snapshot x drafter x domain (and pooled
    over the domains), against the baseline seeds ``bases`` (gate snapshots, one seed each)."""
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


def spread(base_glob: str = BASE_GLOB, fresh_glob: str = FRESH_GLOB, root: Path = Path()) -> str:
    """What ``dspark-bench study gate-tstat-spread`` prints: the run folders matching the globs (relative ones under
    ``root``)."""
    from dspark_bench.evaluation.gate import snapshot

    bases = [snapshot([Path(p)]) for p in sorted(glob.glob(str(root / base_glob)))]
    fresh = [snapshot([Path(p)]) for p in sorted(glob.glob(str(root / fresh_glob)))]
    if not bases or not fresh:
        raise ValueError(f"no run folder matches {base_glob if not bases else fresh_glob} under {root.resolve()}")
    lines = [f"{len(bases)} baseline seeds, {len(fresh)} fresh runs"]
    for scope, z in statistics(bases, fresh).items():
        z = np.array(z)
        lines.append(f"{scope}: {len(z)} statistics, mean {z.mean():.2f}, spread (sd) {z.std(ddof=1):.2f}, "
                     f"below -2: {(z < -2).mean():.3f}")
    return "\n".join(lines) + "\n"

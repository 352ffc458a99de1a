"""Power and sample size of Pearson chi-square tests (noncentral chi-square).

Under an alternative law ``p1`` the Pearson statistic of ``n`` samples tested against ``p0`` is approximately
noncentral chi-square with ``df = cells - 1`` and noncentrality ``lambda = n * w2``, where Cohen's effect size
is ``w2 = sum_i (p1_i - p0_i)^2 / p0_i``. Power at level ``alpha`` is
``P(chi2_df(lambda) > chi2_df.isf(alpha))``; the sample size for a power target solves that for ``lambda``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats


def effect_size(p0: Sequence[float], p1: Sequence[float]) -> float:
    """Cohen's ``w2 = sum (p1 - p0)^2 / p0``; inf when ``p1`` puts mass where ``p0`` has none."""
    a, b = np.asarray(p0, dtype=np.float64), np.asarray(p1, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"laws of different sizes: {a.shape} vs {b.shape}")
    if np.any((a <= 0) & (b > 0)):
        return math.inf
    keep = a > 0
    return float(((b[keep] - a[keep]) ** 2 / a[keep]).sum())


def pooled(law: Sequence[float], groups: Sequence[int]) -> list[float]:
    """Mass of ``law`` per pooling group (groups as returned by :func:`~.hypothesis.pool_cells`)."""
    out = [0.0] * (max(groups) + 1 if groups else 0)
    for mass, g in zip(law, groups, strict=True):
        out[g] += float(mass)
    return out


def power(n: float, w2: float, df: int, alpha: float) -> float:
    """Probability that the level-``alpha`` chi-square test with ``df`` degrees of freedom rejects."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if math.isinf(w2):
        return 1.0
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, n * w2))


def sample_size(w2: float, df: int, alpha: float = 1e-3, target: float = 0.99) -> int:
    """Smallest ``n`` with power at least ``target``; 1 when the alternative is impossible under H0 (w2 = inf)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if not 0 < target < 1:
        raise ValueError(f"target power must lie in (0, 1), got {target}")
    if math.isinf(w2):
        return 1
    if w2 <= 0:
        raise ValueError("w2 = 0: the laws are equal, no sample size gives power")
    crit = stats.chi2.isf(alpha, df)
    hi = 1.0
    while stats.ncx2.sf(crit, df, hi) < target:
        hi *= 2
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, df, x) - target, 0.0, hi, xtol=1e-10)
    return max(1, math.ceil(lam / w2))

"""Hypothesis tests of the lossless battery: pure functions over counts, laws and uniforms.

Terms:

* **cell**: one outcome of the tested variable (a token sequence, or one (prompt, sequence) pair).
* **pooling** (Cochran's rule): cells whose expected count is below ``min_expected`` (5) are merged into one
  "other" group, growing it with the next smallest cells until the group itself reaches ``min_expected``.
  A test then runs over groups, with ``df = groups - 1``.
* **randomized PIT**: for a discrete law ``p`` over tokens in token-id order and an observed token ``y``,
  ``u = F(y - 1) + v * p(y)`` with ``v ~ U(0, 1)`` independent. If ``y ~ p`` then ``u ~ U(0, 1)``; over a
  generated sequence, with ``p`` the true conditional law at each step, the ``u`` are i.i.d. uniform
  (martingale argument), so one KS test covers every position.
* **Holm** step-down: sort the m p-values; reject ``H_(i)`` while ``p_(i) <= alpha / (m - i + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    """Result of a Pearson chi-square test over pooled groups.

    groups: group index of every input cell (cells sharing an index were pooled).
    """

    statistic: float
    df: int
    p_value: float
    groups: tuple[int, ...]


def pool_cells(expected: Sequence[float], min_expected: float = MIN_EXPECTED) -> tuple[int, ...]:
    """Group index per cell so that every group's expected count is at least ``min_expected``.

    Cells below the threshold go into one pool; while the pool is still below it, the next smallest cell joins.
    Cells with zero expectation are pooled too. If all cells together stay below the threshold there is one group.
    """
    order = sorted(range(len(expected)), key=lambda i: expected[i])
    pooled, mass = [], 0.0
    for i in order:
        if expected[i] >= min_expected and (not pooled or mass >= min_expected):
            break
        pooled.append(i)
        mass += expected[i]
    groups = [-1] * len(expected)
    for i in pooled:
        groups[i] = 0
    nxt = 1 if pooled else 0
    for i in range(len(expected)):
        if groups[i] < 0:
            groups[i], nxt = nxt, nxt + 1
    return tuple(groups)


def _grouped(values: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    out = np.zeros(max(groups) + 1 if groups else 0)
    np.add.at(out, np.asarray(groups, dtype=np.int64), values)
    return out


def chi_square_gof(observed: Sequence[float], probs: Sequence[float], min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson goodness of fit of counts ``observed`` against the law ``probs`` (same cell order).

    An observation in a cell of probability 0 is impossible under H0: statistic inf, p-value 0.
    """
    obs = np.asarray(observed, dtype=np.float64)
    law = np.asarray(probs, dtype=np.float64)
    if obs.shape != law.shape:
        raise ValueError(f"observed has {obs.shape} cells but the law has {law.shape}")
    groups = pool_cells(list(obs.sum() * law), min_expected)
    if np.any((law <= 0) & (obs > 0)):
        return ChiSquare(float("inf"), max(groups) if groups else 0, 0.0, groups)
    o, e = _grouped(obs, groups), _grouped(obs.sum() * law, groups)
    keep = e > 0
    statistic = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1
    return ChiSquare(statistic, df, float(stats.chi2.sf(statistic, df)) if df > 0 else 1.0, groups)


def chi_square_gof_strata(tables: Sequence[tuple[Sequence[float], Sequence[float]]],
                          min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson goodness of fit over independent strata, each ``(observed, probs)`` with its own fixed total (e.g.
    one per prompt): each stratum pooled and tested as in :func:`chi_square_gof`, the statistic and df the sums of
    theirs (a product of multinomials: df = sum of (groups - 1), not groups - 1 over all cells). ``groups`` numbers
    the groups of all strata in one sequence."""
    parts = [chi_square_gof(observed, probs, min_expected) for observed, probs in tables]
    statistic, df = sum(p.statistic for p in parts), sum(p.df for p in parts)
    groups, offset = [], 0
    for part in parts:
        groups += [g + offset for g in part.groups]
        offset += max(part.groups, default=-1) + 1
    p_value = 0.0 if math.isinf(statistic) else float(stats.chi2.sf(statistic, df)) if df > 0 else 1.0
    return ChiSquare(statistic, df, p_value, tuple(groups))


def chi_square_homogeneity(
    counts_a: Sequence[float], counts_b: Sequence[float], min_expected: float = MIN_EXPECTED
) -> ChiSquare:
    """Two-sample Pearson homogeneity test on a 2 x K table (same cell order in both rows).

    Expected counts are ``row_total * column_total / N``; columns are pooled so that both rows reach
    ``min_expected`` in every group. ``df = groups - 1``.
    """
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"the two samples have {a.shape} and {b.shape} cells")
    total = a.sum() + b.sum()
    smaller_row = min(a.sum(), b.sum())
    groups = pool_cells(list((a + b) * smaller_row / total), min_expected)
    ga, gb = _grouped(a, groups), _grouped(b, groups)
    cols = ga + gb
    keep = cols > 0
    table = np.stack([ga[keep], gb[keep]])
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / total
    statistic = float(((table - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    return ChiSquare(statistic, df, float(stats.chi2.sf(statistic, df)) if df > 0 else 1.0, groups)


def align(observed: Mapping[Hashable, float], law: Mapping[Hashable, float]) -> tuple[list, list[float], list[float]]:
    """Put a count dict and a law dict on one cell order (the union of their keys, sorted by repr)."""
    cells = sorted(set(observed) | set(law), key=repr)
    return cells, [float(observed.get(c, 0)) for c in cells], [float(law.get(c, 0.0)) for c in cells]


def randomized_pit(
    probs: torch.Tensor,  # [N, V] the law of each observed token, token-id order
    tokens: torch.Tensor,  # [N] observed tokens
    generator: torch.Generator,
) -> torch.Tensor:
    """``u = F(y - 1) + v * p(y)`` per row (float64, ``[N]``), with ``v ~ U(0, 1)`` drawn from ``generator``."""
    p = probs.double()
    p = p / p.sum(-1, keepdim=True)
    idx = tokens.long().unsqueeze(-1)
    below = torch.cumsum(p, -1).gather(-1, idx).squeeze(-1) - p.gather(-1, idx).squeeze(-1)
    v = torch.rand(p.shape[0], generator=generator, dtype=torch.float64)
    return (below + v * p.gather(-1, idx).squeeze(-1)).clamp_(0.0, 1.0)


def ranked_pit(
    probs: torch.Tensor,  # [N, V] the law of each observed token, token-id order
    tokens: torch.Tensor,  # [N] observed tokens
    generator: torch.Generator,
) -> torch.Tensor:
    """:func:`randomized_pit` with the vocabulary ordered by the law itself: most likely token first (ties by id).

    The order is a function of the law alone, so under H0 the values are as uniform as in id order. What changes is
    the power: a sampler that emits too many unlikely tokens (a verifier that accepts or recovers against a wrong
    law) puts them at the top of [0, 1], where the KS test sees them at once; in id order unlikely tokens scatter
    over the whole interval. ``u = P(rank < rank(y)) + v * p(y)``."""
    p = probs.double()
    p = p / p.sum(-1, keepdim=True)
    idx = tokens.long().unsqueeze(-1)
    p_y = p.gather(-1, idx)  # [N, 1]
    ids = torch.arange(p.shape[-1], device=p.device)
    ahead = (p > p_y) | ((p == p_y) & (ids < idx))  # [N, V]: tokens ranked before y
    below = (p * ahead).sum(-1)
    v = torch.rand(p.shape[0], generator=generator, dtype=torch.float64)
    return (below + v * p_y.squeeze(-1)).clamp_(0.0, 1.0)


def ks_uniform(u: Sequence[float] | np.ndarray | torch.Tensor) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov test of ``u`` against U(0, 1): (D statistic, p-value)."""
    values = np.asarray(u.tolist() if isinstance(u, torch.Tensor) else u, dtype=np.float64)
    if values.size == 0:
        raise ValueError("KS test needs at least one value")
    result = stats.kstest(values, "uniform")
    return float(result.statistic), float(result.pvalue)


def holm(p_values: Sequence[float], alpha: float) -> tuple[list[bool], list[float]]:
    """Holm-Bonferroni step-down: (rejected, adjusted p-values), both in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, rejected = [1.0] * m, [False] * m
    running, still_rejecting = 0.0, True
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
        still_rejecting = still_rejecting and p_values[i] <= alpha / (m - rank)
        rejected[i] = still_rejecting
    return rejected, adjusted

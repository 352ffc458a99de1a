"""Engine profile: the target's forward steps per second, SPS(B), against B batch tokens, per context length.

The hardware-aware schedulers (paper Algorithm 1) weigh expected committed tokens against this table. It is
measured once per machine (``dspark-bench profile``) and stored as ``profile.json``::

    {"target", "dtype", "device", "machine", "context_lengths": [...], "batch_tokens": [...],
     "steps_per_s": [[...per batch_tokens...] per context length]}

A table measured on another machine (a GPU) can be given instead; the file says where it was measured.

**Measurement shape.** B tokens are laid out the way our engine verifies them: ``rows = ceil(B / width)``
requests of ``ceil(B / rows)`` tokens each (``width`` = gamma + 1), each row with its own KV cache of the given
context length. ``batch_tokens`` records rows x tokens actually computed. Each point is the median of
``repeats`` timed forwards after ``warmup`` untimed ones; the cache is rolled back after every forward.
Timing noise (a shared machine) can make a bigger batch look faster, so the step times of each context are
made non-decreasing in B by isotonic regression (pool adjacent violators) before they are stored.

**Interpolation** (:meth:`Profile.sps`): in step time ``t = 1 / SPS``, piecewise linear in B, linear
extrapolation beyond the largest measured B with the slope of the chord from about half the largest B to it
(floored at 0: compute-bound growth), the first point's time below the smallest B; linear in context length,
clamped to the measured range.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from dspark_bench.target import Target

DEFAULT_BATCH_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_CONTEXTS = (128, 512)


class ProfileError(ValueError):
    """A profile file or table that cannot be used."""


@dataclass(frozen=True)
class Profile:
    target: str
    dtype: str
    device: str
    machine: str
    context_lengths: tuple[int, ...]
    batch_tokens: tuple[int, ...]
    steps_per_s: tuple[tuple[float, ...], ...]  # [context][batch_tokens]

    def __post_init__(self):
        b, c = self.batch_tokens, self.context_lengths
        if not b or list(b) != sorted(set(b)) or b[0] < 1:
            raise ProfileError(f"batch_tokens must be increasing positive integers, got {list(b)}")
        if not c or list(c) != sorted(set(c)):
            raise ProfileError(f"context_lengths must be increasing, got {list(c)}")
        if len(self.steps_per_s) != len(c) or any(len(row) != len(b) for row in self.steps_per_s):
            raise ProfileError(f"steps_per_s must be {len(c)} rows of {len(b)} values (contexts x batch tokens)")
        if any(not (v > 0 and math.isfinite(v)) for row in self.steps_per_s for v in row):
            raise ProfileError("steps_per_s values must be positive and finite")

    def sps(self, batch_tokens, context: float | None = None) -> np.ndarray:
        """SPS at ``batch_tokens`` (scalar or array) and ``context`` (None: the smallest measured context)."""
        b = np.asarray(batch_tokens, dtype=np.float64)
        grid = np.asarray(self.batch_tokens, dtype=np.float64)
        times = [_step_time(b, grid, 1.0 / np.asarray(row)) for row in self.steps_per_s]
        ctx = np.asarray(self.context_lengths, dtype=np.float64)
        if context is None or len(ctx) == 1:
            return 1.0 / times[0]
        at = float(np.clip(context, ctx[0], ctx[-1]))
        hi = int(np.searchsorted(ctx, at).clip(1, len(ctx) - 1))
        w = (at - ctx[hi - 1]) / (ctx[hi] - ctx[hi - 1])
        return 1.0 / ((1 - w) * times[hi - 1] + w * times[hi])


def _step_time(b: np.ndarray, grid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Piecewise-linear step time at b; past the last grid point, linear with the slope (>= 0) of the chord
    from the grid point nearest half the largest B to the largest (robust to noise in the last points)."""
    inside = np.interp(b, grid, t)
    if len(grid) < 2:
        return inside
    mid = min(int(np.argmin(np.abs(grid - grid[-1] / 2))), len(grid) - 2)
    slope = max((t[-1] - t[mid]) / (grid[-1] - grid[mid]), 0.0)
    return np.where(b > grid[-1], t[-1] + slope * (b - grid[-1]), inside)


def table_profile(sps: Mapping[int, float], name: str = "table") -> Profile:
    """A one-context profile from a {B: SPS} table (tests, paper examples, hand-made cost models)."""
    keys = sorted(sps)
    return Profile(name, "-", "-", "synthetic", (0,), tuple(keys), (tuple(float(sps[k]) for k in keys),))


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"profile {path} not found; measure one with `dspark-bench profile --out {path}`")
    data = json.loads(path.read_text(encoding="utf-8"))
    names = {f.name for f in fields(Profile)}
    if set(data) != names:
        raise ProfileError(f"{path}: keys {sorted(data)}; expected exactly {sorted(names)}")
    data["context_lengths"] = tuple(int(c) for c in data["context_lengths"])
    data["batch_tokens"] = tuple(int(b) for b in data["batch_tokens"])
    data["steps_per_s"] = tuple(tuple(float(v) for v in row) for row in data["steps_per_s"])
    return Profile(**data)


def save_profile(profile: Profile, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(profile), indent=2) + "\n", encoding="utf-8")


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cpus, {torch.get_num_threads()} torch threads"


def layout(batch_tokens: int, width: int) -> tuple[int, int]:
    """(rows, tokens per row) of a B-token verify batch with at most ``width`` tokens per row."""
    rows = math.ceil(batch_tokens / width)
    return rows, math.ceil(batch_tokens / rows)


def measure_profile(target: Target, batch_tokens: Sequence[int] = DEFAULT_BATCH_TOKENS,
                    contexts: Sequence[int] = DEFAULT_CONTEXTS, width: int = 8, repeats: int = 5,
                    warmup: int = 1, seed: int = 0) -> Profile:
    """Time the target's block forward at each (context, B) on this machine (see the module docstring)."""
    if repeats < 1 or warmup < 0 or width < 1 or not batch_tokens or not contexts:
        raise ProfileError("need repeats >= 1, warmup >= 0, width >= 1 and non-empty batch tokens and contexts")
    shapes = sorted({layout(b, width) for b in batch_tokens}, key=lambda s: (-s[0], s[1]))
    table: list[dict[int, float]] = []
    for context in sorted(set(contexts)):
        table.append(_measure_context(target, context, shapes, repeats, warmup, seed))
    tokens = sorted(table[0])
    table = [dict(zip(tokens, 1.0 / isotonic(np.array([1.0 / row[b] for b in tokens])), strict=True)) for row in table]
    return Profile(target.name, str(target.dtype).removeprefix("torch."), str(target.device),
                   machine_name(target.device), tuple(sorted(set(contexts))), tuple(tokens),
                   tuple(tuple(row[b] for b in tokens) for row in table))


def isotonic(values: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values.astype(np.float64):
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def _measure_context(target: Target, context: int, shapes: list[tuple[int, int]], repeats: int, warmup: int,
                     seed: int) -> dict[int, float]:
    """SPS per computed token count at one context; rows are dropped as the shapes shrink (largest first)."""
    # 1. one prefill with the most rows any shape needs
    gen = torch.Generator().manual_seed(seed + context)
    rows = shapes[0][0]
    prompts = torch.randint(3, target.vocab_size, (rows, max(context, 1)), generator=gen).tolist()
    batch, _ = target.prefill(prompts)
    out: dict[int, float] = {}
    # 2. time each shape, rolling the cache back after every forward
    for n_rows, n_tok in shapes:
        if batch.rows > n_rows:
            target.drop(batch, list(range(n_rows, batch.rows)))
        times = [_timed_forward(target, batch, n_tok) for _ in range(warmup + repeats)][warmup:]
        out[n_rows * n_tok] = 1.0 / statistics.median(times)
    return out


def _timed_forward(target: Target, batch, n_tok: int) -> float:
    block = torch.full((batch.rows, n_tok), 5, dtype=torch.long, device=target.device)
    _sync(target.device)
    t0 = time.perf_counter()
    target.forward_block(batch, block, [n_tok] * batch.rows)
    _sync(target.device)
    elapsed = time.perf_counter() - t0
    target.keep(batch, [0] * batch.rows)
    return elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

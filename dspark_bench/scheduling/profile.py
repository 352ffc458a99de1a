"""Engine profile: what a round costs on this machine, the cost model of the hardware-aware schedulers.

Three parts, measured once per machine (``dspark-bench profile``) and stored as ``profile.json``:

* **SPS(B)**: the target's forward steps per second against B batch tokens, per context length (the paper's
  table, for the packed layout): ``context_lengths``, ``batch_tokens``, ``steps_per_s`` [context][B].
* **verify grid** (``verify``, optional): seconds of one target forward of R rows x w tokens per row, per
  context, the shape this engine really computes (blocks right-padded to the longest). A batch of R rows of
  one token costs far more than one row of R tokens (R caches to attend over), so SPS(B) alone misprices
  short verification at high concurrency.
* **round costs** (optional): ``draft`` (per drafter: seconds of its ``propose`` for R requests at the
  profile's ``block_size``) and ``overhead`` (the engine's non-forward seconds per round: sampling,
  acceptance, bookkeeping), each a :class:`Curve` over R. They let a scheduler weigh the drafter's own
  forward and decide not to draft at all.

A profile measured on another machine (a GPU) can be given instead; the file says where it was measured.

**Measurement shape.** B tokens are laid out the way our engine verifies them: ``rows = ceil(B / width)``
requests of ``ceil(B / rows)`` tokens each (``width`` = gamma + 1), each row with its own KV cache of the given
context length, odd rows one token longer. Rows that differ in length, as a real batch's do, attend through an
explicit mask; equal rows without holes take the model's own causal mask, whose cost differs (on the development
CPU in bf16 at 32 rows, one token took 1.5x as long through it). A profile of equal rows priced the engine's
multi-token verifies 21-57 % low at 16 and 32 rows. A single row has no pad, as the engine's ``none`` at concurrency 1.
``batch_tokens`` records rows x tokens actually computed. Each point is the median of
``repeats`` timed forwards after ``warmup`` untimed ones; the cache is rolled back after every forward.
Timing noise (a shared machine) can make a bigger batch look faster, so the step times of each context are
made non-decreasing in B by isotonic regression (pool adjacent violators) before they are stored.

**Interpolation** (:meth:`Profile.sps`, :meth:`VerifyGrid.seconds`, :meth:`Curve.at`): in step time ``t = 1 / SPS``, piecewise linear in B, linear
extrapolation beyond the largest measured B with the slope of the chord from about half the largest B to it
(floored at 0: compute-bound growth), the first point's time below the smallest B; linear in context length,
clamped to the measured range.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from dspark_bench.target.model import Target

DEFAULT_BATCH_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_CONTEXTS = (128, 512)
DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)  # requests per round of the verify grid and the round costs
DEFAULT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8)  # tokens per row of the verify grid (current token + up to 7 drafts)


class ProfileError(ValueError):
    """A profile file or table that cannot be used."""


def _increasing(name: str, values: Sequence[int]) -> None:
    if not values or list(values) != sorted(set(values)) or values[0] < 0:
        raise ProfileError(f"{name} must be increasing non-negative integers, got {list(values)}")


def _positive(name: str, values) -> None:
    if any(not (v > 0 and math.isfinite(v)) for v in np.ravel(np.asarray(values, dtype=np.float64))):
        raise ProfileError(f"{name} values must be positive and finite")


@dataclass(frozen=True)
class Curve:
    """Seconds per round against R requests: piecewise linear, linear past the last point with the chord slope
    of :func:`_step_time`, the first point's value below the first R."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        _increasing("curve rows", self.rows)
        if len(self.seconds) != len(self.rows):
            raise ProfileError(f"a curve needs one value per row count, got {len(self.seconds)} for {len(self.rows)}")
        if any(not (v >= 0 and math.isfinite(v)) for v in self.seconds):
            raise ProfileError("curve seconds must be finite and >= 0")

    def at(self, rows) -> np.ndarray:
        return _step_time(np.asarray(rows, dtype=np.float64), np.asarray(self.rows, dtype=np.float64),
                          np.asarray(self.seconds, dtype=np.float64))


@dataclass(frozen=True)
class VerifyGrid:
    """Seconds of one target forward of R rows x w tokens (``seconds`` [context][rows][width]). Interpolated
    piecewise linearly in w (chord-extrapolated past the widest), then in R (the same), then in context
    (clamped to the measured range)."""

    contexts: tuple[int, ...]
    rows: tuple[int, ...]
    widths: tuple[int, ...]
    seconds: tuple[tuple[tuple[float, ...], ...], ...]

    def __post_init__(self):
        for name in ("contexts", "rows", "widths"):
            _increasing(f"verify {name}", getattr(self, name))
        shape = (len(self.contexts), len(self.rows), len(self.widths))
        if np.asarray(self.seconds, dtype=np.float64).shape != shape:
            raise ProfileError(f"verify seconds must be [contexts][rows][widths] = {list(shape)}")
        _positive("verify seconds", self.seconds)

    def seconds_at(self, rows, width, context: float | None = None) -> np.ndarray:
        """Forward seconds at ``rows`` and ``width`` (scalars or arrays, broadcast together). A scheduler asks
        this every round for one R and all widths: that case is a few vector operations per context."""
        r, w = np.asarray(rows, dtype=np.float64), np.asarray(width, dtype=np.float64)
        if r.ndim == 0:
            per_context = [_step_time(w, self._widths, _at_rows(table, self._rows, float(r))) for table in self._tables]
            return _along_context(per_context, self.contexts, context)
        r, w = np.broadcast_arrays(r, w)
        per_context = []
        for table in self._tables:  # [rows][widths]
            at = [_step_time(x, self._widths, _at_rows(table, self._rows, float(y))) for x, y in
                  zip(w.ravel(), r.ravel(), strict=True)]
            per_context.append(np.asarray(at, dtype=np.float64).reshape(r.shape))
        return _along_context(per_context, self.contexts, context)

    @functools.cached_property
    def _tables(self) -> np.ndarray:  # [contexts, rows, widths]
        return np.asarray(self.seconds, dtype=np.float64)

    @functools.cached_property
    def _rows(self) -> np.ndarray:
        return np.asarray(self.rows, dtype=np.float64)

    @functools.cached_property
    def _widths(self) -> np.ndarray:
        return np.asarray(self.widths, dtype=np.float64)


def _at_rows(table: np.ndarray, grid: np.ndarray, rows: float) -> np.ndarray:
    """One row of ``table`` [rows, widths] at ``rows``: :func:`_step_time`'s interpolation, every width at once."""
    if rows <= grid[0] or len(grid) < 2:
        return table[0] if rows <= grid[0] else table[-1]
    if rows >= grid[-1]:
        mid = min(int(np.argmin(np.abs(grid - grid[-1] / 2))), len(grid) - 2)
        slope = np.maximum((table[-1] - table[mid]) / (grid[-1] - grid[mid]), 0.0)
        return table[-1] + slope * (rows - grid[-1])
    hi = int(np.searchsorted(grid, rows))
    f = (rows - grid[hi - 1]) / (grid[hi] - grid[hi - 1])
    return (1 - f) * table[hi - 1] + f * table[hi]


def _along_context(values: list[np.ndarray], contexts: Sequence[int], context: float | None) -> np.ndarray:
    """Linear in context between the measured ones, clamped; None: the smallest context."""
    ctx = np.asarray(contexts, dtype=np.float64)
    if context is None or len(ctx) == 1:
        return values[0]
    at = min(max(float(context), float(ctx[0])), float(ctx[-1]))
    hi = int(np.searchsorted(ctx, at).clip(1, len(ctx) - 1))
    w = (at - ctx[hi - 1]) / (ctx[hi] - ctx[hi - 1])
    return (1 - w) * values[hi - 1] + w * values[hi]


@dataclass(frozen=True)
class Profile:
    target: str
    dtype: str
    device: str
    machine: str
    context_lengths: tuple[int, ...]
    batch_tokens: tuple[int, ...]
    steps_per_s: tuple[tuple[float, ...], ...]  # [context][batch_tokens]
    verify: VerifyGrid | None = None
    draft: Mapping[str, Curve] = field(default_factory=dict)  # drafter name -> propose seconds vs R
    overhead: Curve | None = None
    block_size: int | None = None  # the proposal length the draft curves were measured at

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
        return 1.0 / _along_context(times, self.context_lengths, context)

    def verify_seconds(self, rows, width, context: float | None = None) -> np.ndarray:
        """Seconds of a target forward of ``rows`` x ``width`` tokens: the verify grid when measured, else
        1 / SPS(rows x width)."""
        if self.verify is not None:
            return self.verify.seconds_at(rows, width, context)
        return 1.0 / self.sps(np.asarray(rows) * np.asarray(width), context)

    def draft_seconds(self, drafter: str, rows) -> np.ndarray | None:
        """Seconds of ``drafter``'s propose for ``rows`` requests, or None when the profile has no curve for it."""
        curve = self.draft.get(drafter)
        return None if curve is None else curve.at(rows)

    def overhead_seconds(self, rows) -> np.ndarray:
        """The engine's non-forward seconds per round (0 when not measured)."""
        return np.zeros(np.shape(rows)) if self.overhead is None else self.overhead.at(rows)


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


_CORE = ("target", "dtype", "device", "machine", "context_lengths", "batch_tokens", "steps_per_s")


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"profile {path} not found; measure one with `dspark-bench profile --out {path}`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # ValueErrors whose message names no file
        raise ProfileError(f"{path} is not a readable profile, a UTF-8 JSON object ({exc}); measure one with "
                           f"`dspark-bench profile --out {path}`") from None
    names = {f.name for f in fields(Profile)}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a JSON {type(data).__name__}; a profile is a JSON object with keys "
                           f"{sorted(_CORE)}")
    if not set(_CORE) <= set(data) <= names:
        raise ProfileError(f"{path}: keys {sorted(data)}; expected {sorted(_CORE)} and optionally "
                           f"{sorted(names - set(_CORE))}")
    try:
        return profile_from_dict(data)
    except (TypeError, KeyError, ValueError) as exc:
        raise ProfileError(f"{path}: {exc}") from None


def profile_from_dict(data: Mapping) -> Profile:
    """A :class:`Profile` from its JSON form (``save_profile``'s output)."""
    verify, draft, overhead = data.get("verify"), data.get("draft") or {}, data.get("overhead")
    return Profile(
        str(data["target"]), str(data["dtype"]), str(data["device"]), str(data["machine"]),
        tuple(int(c) for c in data["context_lengths"]), tuple(int(b) for b in data["batch_tokens"]),
        tuple(tuple(float(v) for v in row) for row in data["steps_per_s"]),
        verify=None if verify is None else VerifyGrid(
            tuple(int(c) for c in verify["contexts"]), tuple(int(r) for r in verify["rows"]),
            tuple(int(w) for w in verify["widths"]),
            tuple(tuple(tuple(float(v) for v in row) for row in table) for table in verify["seconds"])),
        draft={str(k): _curve(v) for k, v in draft.items()},
        overhead=None if overhead is None else _curve(overhead),
        block_size=None if data.get("block_size") is None else int(data["block_size"]),
    )


def _curve(data: Mapping) -> Curve:
    return Curve(tuple(int(r) for r in data["rows"]), tuple(float(v) for v in data["seconds"]))


def save_profile(profile: Profile, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(profile)
    data["draft"] = dict(data["draft"])
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


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
        seconds = _measure_context(target, context, shapes, repeats, warmup, seed)
        table.append({rows * tok: 1.0 / t for (rows, tok), t in seconds.items()})
    tokens = sorted(table[0])
    table = [dict(zip(tokens, 1.0 / isotonic(np.array([1.0 / row[b] for b in tokens])), strict=True)) for row in table]
    return Profile(target.name, str(target.dtype).removeprefix("torch."), str(target.device),
                   machine_name(target.device), tuple(sorted(set(contexts))), tuple(tokens),
                   tuple(tuple(row[b] for b in tokens) for row in table))


def measure_verify_grid(target: Target, rows: Sequence[int] = DEFAULT_ROWS, widths: Sequence[int] = DEFAULT_WIDTHS,
                        contexts: Sequence[int] = DEFAULT_CONTEXTS, repeats: int = 5, warmup: int = 1,
                        seed: int = 0) -> VerifyGrid:
    """Seconds of the target's block forward at every (context, rows, width), made non-decreasing in width
    and then in rows (isotonic regression, as SPS(B))."""
    if repeats < 1 or warmup < 0 or not rows or not widths or not contexts or min(rows) < 1 or min(widths) < 1:
        raise ProfileError("need repeats >= 1, warmup >= 0 and non-empty positive rows, widths and contexts")
    rows, widths, contexts = sorted(set(rows)), sorted(set(widths)), sorted(set(contexts))
    shapes = [(r, w) for r in reversed(rows) for w in widths]
    tables = []
    for context in contexts:
        seconds = _measure_context(target, context, shapes, repeats, warmup, seed)
        t = np.array([[seconds[(r, w)] for w in widths] for r in rows])  # [rows, widths]
        t = np.stack([isotonic(row) for row in t])
        t = np.stack([isotonic(col) for col in t.T]).T
        tables.append(tuple(tuple(float(v) for v in row) for row in t))
    return VerifyGrid(tuple(contexts), tuple(rows), tuple(widths), tuple(tables))


def isotonic(values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in (weighted) least squares (pool adjacent violators)."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=np.float64)
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks]) if blocks else values


def _measure_context(target: Target, context: int, shapes: Sequence[tuple[int, int]], repeats: int, warmup: int,
                     seed: int) -> dict[tuple[int, int], float]:
    """Median forward seconds per (rows, tokens) shape at one context; ``shapes`` come with rows non-increasing,
    and rows are dropped from one prefilled batch as they shrink."""
    # 1. one prefill with the most rows any shape needs; odd rows one token longer (see the module docstring)
    gen = torch.Generator().manual_seed(seed + context)
    rows = shapes[0][0]
    prompts = [torch.randint(3, target.vocab_size, (max(context, 1) + r % 2,), generator=gen).tolist()
               for r in range(rows)]
    batch, _ = target.prefill(prompts)
    out: dict[tuple[int, int], float] = {}
    # 2. time each shape, rolling the cache back after every forward
    for n_rows, n_tok in shapes:
        if batch.rows > n_rows:
            target.drop(batch, list(range(n_rows, batch.rows)))
        times = [_timed_forward(target, batch, n_tok) for _ in range(warmup + repeats)][warmup:]
        out[(n_rows, n_tok)] = statistics.median(times)
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

"""Schedulers: how many of each request's draft tokens are sent to the target this round.

A scheduler sees the proposal (and, through the context, the active requests) and returns verify lengths
``l_r`` with ``0 <= l_r <= proposal.lengths[r]``. Lossless schedulers are *non-anticipating*: whether draft
token k is verified may depend only on what was known before x_k was sampled (c_1..c_k depend on
x_0..x_{k-1}). The engine further caps each length by the request's remaining token budget.

Terms used by the confidence schedulers (paper section 3.2, reference section 4):

* **survival** ``a_{r,j} = prod_{i<=j} c_{r,i}`` of the (calibrated) conditional confidences; non-increasing in j.
* **candidates**: the pairs (r, j) with ``j <= lengths[r]`` and ``a_{r,j} > 0``, ranked by a descending, ties
  by request index then position, so a request's j always comes after its j-1.
* **cost model**: with verify lengths l, ``E = sum_r (1 + sum_{j<=l_r} a_{r,j})`` expected committed tokens,
  ``B`` batch tokens and ``Theta = E * SPS(B)``. ``layout="packed"`` (the paper's flattened variable-length
  verify): ``B = sum_r (1 + l_r)``. ``layout="padded"`` (this engine: blocks are right-padded to the longest,
  so the target computes ``B = R (1 + max_r l_r)``): the unit of admission is a whole column L, every request
  verifying ``min(L, lengths[r])``, because slots inside the padded width cost nothing extra.
* **calibration**: ``c_k <- sigmoid(logit(c_k) / T_k)`` with STS temperatures from a ``calibration.json``
  (:mod:`dspark_bench.calibration`), applied before anything else reads the confidences.

Options reach a scheduler only through ``create_scheduler(name, **options)``; strings (from the CLI) are
converted to the option's declared type. ``profile`` is a ``profile.json`` path or a :class:`Profile`; without
one, the first ``decide`` measures a small profile of ``ctx.target`` (slow: pass one).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from dspark_bench.calibration import apply_temperatures, load_temperatures
from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.profile import Profile, load_profile, measure_profile

_SCHEDULERS: dict[str, type[Scheduler]] = {}  # filled by @register_scheduler at import time only
LAYOUTS = ("packed", "padded")
SpsFn = Callable[[np.ndarray], np.ndarray]  # batch tokens [n] -> steps per second [n]


class SchedulerError(ValueError):
    """Unknown scheduler or bad scheduler options."""


def register_scheduler(name: str):
    def wrap(cls):
        if name in _SCHEDULERS:
            raise SchedulerError(f"scheduler {name!r} registered twice")
        cls.name = name
        _SCHEDULERS[name] = cls
        return cls

    return wrap


def scheduler_names() -> tuple[str, ...]:
    return tuple(sorted(_SCHEDULERS))


def scheduler_class(name: str) -> type[Scheduler]:
    if name not in _SCHEDULERS:
        raise SchedulerError(f"unknown scheduler {name!r}; known schedulers: {', '.join(scheduler_names())}")
    return _SCHEDULERS[name]


def create_scheduler(name: str, **options) -> Scheduler:
    cls = scheduler_class(name)
    return cls(**_coerce_options(cls, options))


def _coerce_options(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Unknown keys are errors; CLI strings become the declared int/float/bool, 'none' becomes None."""
    known = {f.name: f for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else {}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise SchedulerError(f"scheduler {cls.name!r} has no option(s) {', '.join(unknown)}; "
                             f"its options: {', '.join(known) or '(none)'}")
    out = {}
    for key, value in options.items():
        kind = str(known[key].type)
        if isinstance(value, str) and value.lower() == "none" and "None" in kind:
            value = None
        elif isinstance(value, str):
            try:
                value = int(value) if kind.startswith("int") else float(value) if kind.startswith("float") else value
            except ValueError:
                raise SchedulerError(f"option {key}={value!r} of {cls.name!r} is not a valid {kind}") from None
        out[key] = value
    return out


class Scheduler(ABC):
    name: ClassVar[str]
    reads_confidence: ClassVar[bool] = False  # takes a ``calibration`` option and falls back to fixed without c

    @abstractmethod
    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        """Verify lengths, ``[R]`` long, each within ``0..proposal.lengths[r]``."""


@register_scheduler("fixed")
@dataclass(frozen=True)
class Fixed(Scheduler):
    """Verify every proposed token (the paper's offline protocol), or at most ``length`` of them (a static
    verify length: ``length=1`` verifies 2 tokens per step, as MTP-1)."""

    length: int | None = None

    def __post_init__(self):
        if self.length is not None and self.length < 0:
            raise SchedulerError(f"fixed length must be >= 0, got {self.length}")

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        if self.length is None:
            return proposal.lengths.clone()
        return proposal.lengths.clamp(max=self.length)


def threshold_lengths(confidence: torch.Tensor, lengths: torch.Tensor, theta: float) -> torch.Tensor:
    """Leading run of positions with ``c_k >= theta`` (reference rule); theta <= 0 keeps everything.

    confidence: [R, k] conditional confidences; lengths: [R] proposed lengths.
    """
    if theta <= 0 or confidence.shape[1] == 0:
        return lengths.clone()
    run = torch.cumprod((confidence >= theta).long(), dim=1).sum(1)
    return torch.minimum(run, lengths)


def _temperatures(calibration: str | Sequence[float] | None) -> tuple[float, ...]:
    if calibration is None:
        return ()
    return load_temperatures(calibration) if isinstance(calibration, str) else tuple(float(t) for t in calibration)


@register_scheduler("threshold")
@dataclass(frozen=True)
class Threshold(Scheduler):
    """Verify the leading draft tokens whose own (calibrated, if ``calibration`` is given) confidence c_k is
    at least ``theta``. Without confidences from the drafter it verifies everything (fixed)."""

    theta: float = 0.5
    calibration: str | None = None  # calibration.json path (or a sequence of temperatures)
    reads_confidence: ClassVar[bool] = True
    _temps: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_temps", _temperatures(self.calibration))  # read the file once

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        if proposal.confidence is None:
            return proposal.lengths.clone()  # no confidences: nothing to prune on, behaves as fixed
        conf = apply_temperatures(proposal.confidence.float().cpu(), self._temps)
        return threshold_lengths(conf, proposal.lengths, self.theta)


# ---- pure cores ---------------------------------------------------------------------------------------------
def survival(confidence, lengths) -> np.ndarray:
    """a_{r,j} = prod_{i<=j} c_{r,i} [R, k] (float64), zero at positions j > lengths[r]."""
    c = np.nan_to_num(np.asarray(confidence, dtype=np.float64), nan=0.0).clip(0.0, 1.0)
    a = np.cumprod(c, axis=1)
    a[np.arange(c.shape[1])[None, :] >= np.asarray(lengths)[:, None]] = 0.0
    return a


def ranked_candidates(surv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r, j, a) of every candidate with a > 0, by a descending, then request index, then position (j 0-based)."""
    r, j = np.nonzero(surv > 0)
    a = surv[r, j]
    order = np.lexsort((j, r, -a))
    return r[order], j[order], a[order]


def prefix_lengths(surv: np.ndarray, sps: SpsFn, early_stop: bool = True) -> np.ndarray:
    """Algorithm 1 (``early_stop``) or the retrospective global search (not lossless) over ranked candidates,
    packed layout. Returns l [R]."""
    rows = surv.shape[0]
    r, _, a = ranked_candidates(surv)
    b = rows + np.arange(len(a) + 1)  # batch tokens after admitting 0..n candidates
    theta = (rows + np.concatenate([[0.0], np.cumsum(a)])) * sps(b)  # Theta_0 = R * SPS(R)
    if early_stop:
        raised = theta[1:] > theta[:-1]  # every admission so far raised Theta, so best = the previous Theta
        n = int(np.argmin(raised)) if not raised.all() else len(a)
    else:
        n = int(np.argmax(theta))  # the first maximum
    return np.bincount(r[:n], minlength=rows)


def column_lengths(surv: np.ndarray, lengths, sps: SpsFn, early_stop: bool = True) -> np.ndarray:
    """Padded layout: widen every request to column L = 1, 2, ... while Theta rises (``early_stop``), or take
    the best L (global). Column L holds min(L, lengths[r]) tokens of each request. Returns l [R]."""
    rows, width = surv.shape[0], int(np.max(lengths, initial=0))
    gain = np.concatenate([[0.0], surv[:, :width].sum(0)])  # expected tokens that column L adds
    theta = (rows + np.cumsum(gain)) * sps(rows * (np.arange(width + 1) + 1))
    if early_stop:
        raised = theta[1:] > theta[:-1]
        best = int(np.argmin(raised)) if not raised.all() else width
    else:
        best = int(np.argmax(theta))
    return np.minimum(np.asarray(lengths), best)


def budget_lengths(surv: np.ndarray, capacity: int) -> np.ndarray:
    """Global top-``capacity`` candidates (no early stop). Returns l [R]."""
    r, _, _ = ranked_candidates(surv)
    return np.bincount(r[:capacity], minlength=surv.shape[0])


def best_capacity(surv: np.ndarray, sps: SpsFn) -> int:
    """Packed layout: the number of candidates K maximising (R + top-K survival sum) * SPS(R + K)."""
    return int(prefix_lengths(surv, sps, early_stop=False).sum())


# ---- confidence schedulers ----------------------------------------------------------------------------------
@dataclass(eq=False)
class _Confident(Scheduler):
    """Shared options: ``profile`` (SPS table), ``calibration`` (STS temperatures), ``layout``."""

    profile: str | Profile | None = None
    calibration: str | None = None
    layout: str = "packed"
    reads_confidence: ClassVar[bool] = True
    _table: Profile | None = field(default=None, init=False, repr=False)
    _temps: tuple[float, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise SchedulerError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        self._table = load_profile(self.profile) if isinstance(self.profile, str) else self.profile
        self._temps = _temperatures(self.calibration)

    def _calibrated(self, proposal: Proposal) -> np.ndarray:
        """Calibrated conditional confidences [R, k] (float64)."""
        return apply_temperatures(proposal.confidence.double().cpu().numpy(), self._temps)

    def _survival(self, proposal: Proposal) -> np.ndarray:
        return survival(self._calibrated(proposal), proposal.lengths.cpu().numpy())

    def _sps(self, ctx: DraftContext) -> SpsFn:
        """SPS(B) at the batch's mean context; measures a small profile of the target on first use if none."""
        if self._table is None:
            self._table = measure_profile(ctx.target, (1, 2, 4, 8, 16, 32, 64, 128), (256,), repeats=3)
        context = float(np.mean([s.position for s in ctx.slots])) if ctx.slots else None
        table = self._table
        return lambda b: np.asarray(table.sps(b, context), dtype=np.float64)


@register_scheduler("hardware-aware")
@dataclass(eq=False)
class HardwareAware(_Confident):
    """Paper Algorithm 1: admit ranked candidates while Theta = E * SPS(B) rises; stop at the first admission
    that does not raise it (the early stop keeps it non-anticipating, hence lossless). ``layout="padded"``
    admits whole columns instead (module docstring). Without confidences from the drafter: fixed."""

    early_stop: ClassVar[bool] = True

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        if proposal.confidence is None:
            return proposal.lengths.clone()
        surv, sps = self._survival(proposal), self._sps(ctx)
        if self.layout == "packed":
            out = prefix_lengths(surv, sps, self.early_stop)
        else:
            out = column_lengths(surv, proposal.lengths.cpu().numpy(), sps, self.early_stop)
        return torch.as_tensor(out, dtype=torch.long)


class _Retrospective(HardwareAware):
    """Global search without the early stop on the current round's survivals: NOT lossless (paper Appendix A:
    admitting x_1 depends on c_2, which depends on x_1). A negative control for the lossless battery; kept
    out of the registry on purpose."""

    name: ClassVar[str] = "retrospective"
    early_stop: ClassVar[bool] = False


@dataclass
class _History:
    slot: object  # the engine's Slot: a new object means a new request with a reused id
    confidences: deque  # calibrated c vectors of the request's last ``lag`` rounds, oldest first


@register_scheduler("async")
@dataclass(eq=False)
class Async(_Confident):
    """Production variant (paper section 5.1): the capacity is predicted from each request's calibrated
    confidences ``lag`` rounds earlier (kept here, by request id; ``prior`` survival per position for a
    request without that history), by a global search without early stop: K tokens (packed) or a column
    width L (padded). The current round then verifies the global top-K by current survival (packed) or
    min(L, proposed) per request (padded). Lossless because K never depends on the current round. Without
    confidences: fixed (the history still records nothing)."""

    lag: int = 2
    prior: float = 0.5
    last_capacity: int | None = field(default=None, init=False)
    _history: dict[int, _History] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        if self.lag < 1 or not 0.0 <= self.prior <= 1.0:
            raise SchedulerError(f"async needs lag >= 1 and 0 <= prior <= 1, got {self.lag}, {self.prior}")

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        capacity = self.capacity(ctx)  # 1. from history only: computed before the proposal is looked at
        self.last_capacity = capacity
        if proposal.confidence is None:
            return proposal.lengths.clone()
        conf = self._calibrated(proposal)
        self._remember(ctx, conf, proposal.lengths)  # 2. this round becomes history for later rounds
        surv = survival(conf, proposal.lengths.cpu().numpy())
        if self.layout == "packed":
            out = budget_lengths(surv, capacity)
        else:
            out = np.minimum(proposal.lengths.cpu().numpy(), capacity)
        return torch.as_tensor(out, dtype=torch.long)

    def capacity(self, ctx: DraftContext) -> int:
        """K (packed) or L (padded) from the lagged survivals of the requests now in ``ctx.slots``."""
        self._forget(ctx)
        lagged = [self._lagged(slot, ctx.block_size) for slot in ctx.slots]
        width = max((len(a) for a in lagged), default=0)
        surv = np.zeros((len(lagged), width))
        for r, a in enumerate(lagged):
            surv[r, : len(a)] = a
        sps = self._sps(ctx)
        if self.layout == "packed":
            return best_capacity(surv, sps)
        return int(column_lengths(surv, np.full(len(lagged), width), sps, early_stop=False).max(initial=0))

    def _lagged(self, slot, block_size: int) -> np.ndarray:
        hist = self._history.get(slot.request_id)
        if hist is None or len(hist.confidences) < self.lag:
            return survival(np.full((1, block_size), self.prior), [block_size])[0]
        conf = hist.confidences[0]
        return survival(conf[None, :], [len(conf)])[0]

    def _remember(self, ctx: DraftContext, conf: np.ndarray, lengths: torch.Tensor) -> None:
        for r, slot in enumerate(ctx.slots):
            hist = self._history.setdefault(slot.request_id, _History(slot, deque(maxlen=self.lag)))
            hist.confidences.append(conf[r, : int(lengths[r])].copy())

    def _forget(self, ctx: DraftContext) -> None:
        """Drop requests that left, and history of a reused id that belongs to an earlier request."""
        live = {slot.request_id: slot for slot in ctx.slots}
        for rid in list(self._history):
            if live.get(rid) is not self._history[rid].slot:
                del self._history[rid]

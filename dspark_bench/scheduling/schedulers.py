"""Schedulers: how many of each request's draft tokens are sent to the target this round.

A scheduler sees the proposal (and, through the context, the active requests) and returns verify lengths
``l_r`` with ``0 <= l_r <= proposal.lengths[r]``. Lossless schedulers are *non-anticipating*: whether draft
token k is verified may depend only on what was known before x_k was sampled (c_1..c_k depend on
x_0..x_{k-1}). The engine further caps each length by the request's remaining token budget.

Terms used by the confidence schedulers (paper section 3.2, reference section 4):

* **survival** ``a_{r,j} = prod_{i<=j} c_{r,i}`` of the (calibrated) conditional confidences; non-increasing in j.
* **candidates**: the pairs (r, j) with ``j <= lengths[r]`` and ``a_{r,j} > 0``, ranked by a descending, ties
  by request index then position, so a request's j always comes after its j-1.
* **cost model** (:mod:`dspark_bench.scheduling.profile`): with verify lengths l, ``E = sum_r (1 + sum_{j<=l_r} a_{r,j})``
  expected committed tokens and ``Theta = E / T``, T the round's seconds. The paper prices only the target:
  ``T = 1 / SPS(B)``. With ``costs`` (default) and a profile that measured them, T also holds the drafter's
  ``propose`` at R requests and the engine's own overhead: ``T = draft(R) + overhead(R) + verify``.
  ``layout="packed"`` (the paper's flattened variable-length verify): ``verify = 1 / SPS(B)``,
  ``B = sum_r (1 + l_r)``. ``layout="padded"`` (this engine: blocks are right-padded to the longest):
  ``verify`` = the profile's forward seconds of R rows x (1 + L) tokens; the unit of admission is a whole
  column L, every request verifying ``min(L, lengths[r])``, because slots inside the padded width cost nothing
  extra.
* **plan** (before the drafter runs) and **observe** (after verification): a scheduler may decide from what is
  already known that no request's drafts would pay this round; the engine then skips the drafter's forward and
  decodes one token per request, as vanilla decoding does. ``observe`` hands it each round's verified and
  accepted counts. Neither looks at a draft token of the round it decides, so both keep the output lossless.
* **measured survival**: ``h_j`` = the share of verified draft tokens at position j that survived given that
  1..j-1 did, over the run's earlier rounds (a Beta prior of mean ``prior`` and weight 2 before any);
  ``a_j = prod_{i<=j} h_i``. It stands in for the confidences of a drafter that predicts none. ``plan`` weighs
  the mean survival of the run's recent proposals (recalibrated now), since the round's own confidences do not
  exist before its drafts; ``h`` for a drafter without confidences. Not ``h`` for one with them: where ``decide``
  verifies only confident tokens, ``h_j`` counts only those, and overstates what a round will deliver
  (sweep of 2026-12-03, 6f4035d, concurrency 4: ``h`` promised 1.9 tokens a request where rounds delivered 1.6).
* **adapt** (on by default): the profile was measured once, apart from the engine, and a batch's real forwards
  can cost another price (measured on the development CPU: 0.81-0.88x the profile at R = 4, 1.17-1.43x at
  R = 16-32 for a verify of several tokens). After each round the engine leaves what it measured in
  ``ctx.last_round``; the scheduler divides each part (the verify forward of a round with or without draft tokens,
  the drafter's propose, the engine's own time in either kind of round) by the profile's price of that shape and
  multiplies later prices at the same R by the median of the last 15 such ratios. Timings do not depend on the
  tokens drafted, so this keeps the decisions non-anticipating (lossless), but it makes them depend on the
  machine's timing: two runs with the same seeds may verify different lengths (each run lossless, its outputs
  not replayable token for token). ``adapt=false`` decides from the profile alone, reproducibly.
* **calibration**: ``c_k <- sigmoid(logit(c_k) / T_k)`` with STS temperatures from a ``calibration.json``
  (:mod:`dspark_bench.scheduling.calibration`), applied before anything else reads the confidences.
* **recalibrate** (on by default): the temperatures were fitted offline on other prompts, and on the suites a
  drafter can be overconfident (sweep of 2026-12-03, 6f4035d, concurrency 4, the DSpark shipped then: a
  calibrated 0.45 survived 0.28-0.35 of the time, a 0.65 about 0.5). :class:`OnlineCalibration` bins the calibrated confidences of the
  draft tokens the run verified (each tested only if its predecessors survived) against whether they survived,
  and maps later confidences through the binned rates (a prior of weight ``OnlineCalibration.WEIGHT`` at the
  identity). Binning on c itself keeps the rates unbiased although the scheduler verifies the confident tokens
  more often. It learns only from earlier rounds, so it keeps the decisions lossless.

Options reach a scheduler only through ``create_scheduler(name, **options)``; strings (from the CLI) are
converted to the option's declared type (``true``/``false`` for flags). ``profile`` is a ``profile.json`` path or a
:class:`Profile`; a run given none measures a small profile of its target before any timed round
(:func:`with_profile`), and a confidence scheduler asked to decide without one is an error: a profile is never
measured inside a round.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.scheduling.calibration import apply_temperatures, load_temperatures
from dspark_bench.scheduling.profile import Profile, isotonic, load_profile, measure_profile

if TYPE_CHECKING:
    from dspark_bench.target.model import Target

_SCHEDULERS: dict[str, type[Scheduler]] = {}  # filled by @register_scheduler at import time only
LAYOUTS = ("packed", "padded")
_SIBLING = {"plain": "multi", "multi": "plain", "other/plain": "other/multi", "other/multi": "other/plain"}
_DRAFTED = ("multi", "draft", "other/multi")  # a drafted round's parts: learnt relative to the vanilla step's
SecondsFn = Callable[[np.ndarray], np.ndarray]  # verify shape [n] (B tokens, or column width L) -> round seconds [n]


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


SMALL_PROFILE = ((1, 2, 4, 8, 16, 32, 64, 128), (256,), 3)  # batch tokens, contexts, repeats


def with_profile(scheduler: Scheduler, target: Target, measured: dict | None = None) -> Scheduler:
    """``scheduler``, given a small profile of ``target`` (:data:`SMALL_PROFILE`) if it prices rounds and has none.
    Call it before the timed rounds; ``measured`` (a dict the caller keeps) holds the profile across the run's
    schedulers, so it is measured once."""
    if isinstance(scheduler, _Confident) and scheduler._table is None:
        kept = measured if measured is not None else {}
        if "profile" not in kept:
            kept["profile"] = measure_profile(target, SMALL_PROFILE[0], SMALL_PROFILE[1], repeats=SMALL_PROFILE[2])
        scheduler._table = kept["profile"]
    return scheduler


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
        elif isinstance(value, str) and kind.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise SchedulerError(f"option {key}={value!r} of {cls.name!r} is not a valid bool (true or false)")
            value = value.lower() in ("true", "1")
        elif isinstance(value, str):
            try:
                value = int(value) if kind.startswith("int") else float(value) if kind.startswith("float") else value
            except ValueError:
                raise SchedulerError(f"option {key}={value!r} of {cls.name!r} is not a valid {kind}") from None
        out[key] = value
    return out


def parse_scheduler(item: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name[key=value,...]`` (inline options, so one sweep can hold two variants of a scheduler)."""
    name, _, rest = item.partition("[")
    if rest and not rest.endswith("]"):
        raise SchedulerError(f"{item!r}: expected NAME or NAME[KEY=VALUE,...]")
    opts = {}
    for pair in filter(None, rest[:-1].split(",")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise SchedulerError(f"{item!r}: option {pair!r} is not KEY=VALUE")
        opts[key.strip()] = value.strip()
    return name.strip(), opts


def split_schedulers(text: str) -> tuple[str, ...]:
    """Split a comma list of scheduler items at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    return tuple(item for item in items if item)


class Scheduler(ABC):
    name: ClassVar[str]
    reads_confidence: ClassVar[bool] = False  # takes a ``calibration`` option and falls back to fixed without c

    @abstractmethod
    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        """Verify lengths, ``[R]`` long, each within ``0..proposal.lengths[r]``."""

    def plan(self, ctx: DraftContext) -> bool:
        """Before the round's drafts exist: False skips the drafter this round (every request verifies 0)."""
        return True

    def observe(self, ctx: DraftContext, verified: Sequence[int], accepted: Sequence[int]) -> None:  # noqa: B027
        """After verification: the round's verified and accepted draft counts per request, in batch order."""

    def warmup_copy(self) -> Scheduler:
        """The scheduler an untimed warmup decodes with: a copy, so that the warmup's cold, unrecorded rounds
        teach this one nothing (:meth:`keep_warmup` takes back what it measured of the machine)."""
        return copy.deepcopy(self)

    def keep_warmup(self, warm: Scheduler) -> None:  # noqa: B027
        """After the warmup with ``warm`` (:meth:`warmup_copy`): keep what is a fact of the machine, not learnt."""


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


def _to8(context: float) -> float:
    """A context rounded to 8 tokens: the key of the memoised prices."""
    return 8.0 * round(context / 8.0)


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


def prefix_lengths(surv: np.ndarray, seconds: SecondsFn, early_stop: bool = True) -> np.ndarray:
    """Algorithm 1 (``early_stop``) or the retrospective global search (not lossless) over ranked candidates,
    packed layout: ``seconds`` of B batch tokens. Returns l [R]."""
    rows = surv.shape[0]
    r, _, a = ranked_candidates(surv)
    b = rows + np.arange(len(a) + 1)  # batch tokens after admitting 0..n candidates
    theta = (rows + np.concatenate([[0.0], np.cumsum(a)])) / seconds(b)  # Theta_0 = R / T(R)
    if early_stop:
        raised = theta[1:] > theta[:-1]  # every admission so far raised Theta, so best = the previous Theta
        n = int(np.argmin(raised)) if not raised.all() else len(a)
    else:
        n = int(np.argmax(theta))  # the first maximum
    return np.bincount(r[:n], minlength=rows)


def column_lengths(surv: np.ndarray, lengths, seconds: SecondsFn, early_stop: bool = True) -> np.ndarray:
    """Padded layout: widen every request to column L = 1, 2, ... while Theta rises (``early_stop``), or take
    the best L (global); ``seconds`` of column width L. Column L holds min(L, lengths[r]) tokens of each
    request. Returns l [R]."""
    return np.minimum(np.asarray(lengths), best_column(surv, lengths, seconds, early_stop)[0])


def best_column(surv: np.ndarray, lengths, seconds: SecondsFn, early_stop: bool = True) -> tuple[int, float]:
    """(L, Theta_L) of :func:`column_lengths`' choice."""
    rows, width = surv.shape[0], int(np.max(lengths, initial=0))
    gain = np.concatenate([[0.0], surv[:, :width].sum(0)])  # expected tokens that column L adds
    theta = (rows + np.cumsum(gain)) / seconds(np.arange(width + 1))
    if early_stop:
        raised = theta[1:] > theta[:-1]
        best = int(np.argmin(raised)) if not raised.all() else width
    else:
        best = int(np.argmax(theta))
    return best, float(theta[best])


def budget_lengths(surv: np.ndarray, capacity: int) -> np.ndarray:
    """Global top-``capacity`` candidates (no early stop). Returns l [R]."""
    r, _, _ = ranked_candidates(surv)
    return np.bincount(r[:capacity], minlength=surv.shape[0])


def best_capacity(surv: np.ndarray, seconds: SecondsFn) -> int:
    """Packed layout: the number of candidates K maximising (R + top-K survival sum) / T(R + K)."""
    return int(prefix_lengths(surv, seconds, early_stop=False).sum())


@dataclass
class AcceptanceCounts:
    """Per draft position j (0-based here): ``tested[j]`` verified tokens at j whose predecessors all survived,
    ``passed[j]`` those that survived too. The measured survival of the module docstring."""

    tested: np.ndarray = field(default_factory=lambda: np.zeros(0))
    passed: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, verified: Sequence[int], accepted: Sequence[int]) -> None:
        v, a = np.asarray(verified, dtype=np.int64), np.asarray(accepted, dtype=np.int64)
        width = int(v.max(initial=0))
        if width > len(self.tested):
            self.tested = np.pad(self.tested, (0, width - len(self.tested)))
            self.passed = np.pad(self.passed, (0, width - len(self.passed)))
        j = np.arange(width)[None, :]
        self.tested[:width] += ((j < v[:, None]) & (j <= a[:, None])).sum(0)
        self.passed[:width] += (j < a[:, None]).sum(0)

    def conditional(self, width: int, prior: float) -> np.ndarray:
        """h_1..h_width [width] (float64), each with a Beta(2 prior, 2 (1 - prior)) prior."""
        tested, passed = np.zeros(width), np.zeros(width)
        n = min(width, len(self.tested))
        tested[:n], passed[:n] = self.tested[:n], self.passed[:n]
        return (passed + 2.0 * prior) / (tested + 2.0)


@dataclass
class OnlineCalibration:
    """Confidence -> survival rate learnt during a run (the module docstring's *recalibrate*).

    ``BINS`` equal bins of c on [0, 1], pooled over positions (a conditional confidence means the same at every
    position). A bin's rate is ``(passed + WEIGHT * cbar) / (tested + WEIGHT)``, cbar the mean confidence seen
    in it: with little evidence the map stays near the identity. The rates of the bins seen are made
    non-decreasing (pool adjacent violators, weighted by tested + WEIGHT), and a confidence moves by the offset
    ``rate - cbar``, interpolated between the seen bins' means (the nearest one's beyond them), so confidences
    keep their order. Before any tested draft the map is the identity."""

    BINS: ClassVar[int] = 10
    WEIGHT: ClassVar[float] = 8.0
    tested: np.ndarray = field(default_factory=lambda: np.zeros(OnlineCalibration.BINS))
    passed: np.ndarray = field(default_factory=lambda: np.zeros(OnlineCalibration.BINS))
    total: np.ndarray = field(default_factory=lambda: np.zeros(OnlineCalibration.BINS))  # sum of tested confidences
    _offsets: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    def add(self, confidence: np.ndarray, verified: Sequence[int], accepted: Sequence[int]) -> None:
        """``confidence`` [R, k] of a round's drafts (calibrated as the scheduler read them); draft j of request r
        was tested iff j < verified[r] and j <= accepted[r], and survived iff j < accepted[r]."""
        c = np.asarray(confidence, dtype=np.float64)
        if c.size == 0:
            return
        j = np.arange(c.shape[1])[None, :]
        v, a = np.asarray(verified)[:, None], np.asarray(accepted)[:, None]
        tested = (j < v) & (j <= a)
        if not tested.any():
            return
        seen = np.nan_to_num(c[tested], nan=0.0).clip(0.0, 1.0)
        b = self._bin(seen)
        self.tested += np.bincount(b, minlength=self.BINS)
        self.passed += np.bincount(b, weights=(j < a)[tested].astype(np.float64), minlength=self.BINS)
        self.total += np.bincount(b, weights=seen, minlength=self.BINS)
        self._offsets = None

    def map(self, confidence: np.ndarray) -> np.ndarray:
        c = np.nan_to_num(np.asarray(confidence, dtype=np.float64), nan=0.0).clip(0.0, 1.0)
        if not self.tested.any():
            return c
        if self._offsets is None:
            seen = self.tested > 0
            n, mean = self.tested[seen], self.total[seen] / self.tested[seen]
            rate = isotonic((self.passed[seen] + self.WEIGHT * mean) / (n + self.WEIGHT), n + self.WEIGHT)
            self._offsets = (mean, rate - mean)
        mean, offset = self._offsets
        return (c + np.interp(c, mean, offset)).clip(0.0, 1.0)

    def _bin(self, c: np.ndarray) -> np.ndarray:
        return np.minimum((c * self.BINS).astype(np.int64), self.BINS - 1)


# ---- confidence schedulers ----------------------------------------------------------------------------------
@dataclass(eq=False)
class _Confident(Scheduler):
    """Shared options: ``profile`` (the cost model), ``calibration`` (STS temperatures), ``layout``, ``costs``
    (price the drafter's propose and the engine overhead when the profile measured them), ``adapt`` (correct
    the profile's prices by what the engine measures as it runs) and ``recalibrate`` (correct the confidences by
    what survived in earlier rounds): module docstring."""

    profile: str | Profile | None = None
    calibration: str | None = None
    layout: str = "packed"
    costs: bool = True
    adapt: bool = True
    recalibrate: bool = True
    reads_confidence: ClassVar[bool] = True
    ADAPT_WINDOW: ClassVar[int] = 15  # the last rounds of a kind whose measured / priced ratios are kept
    _table: Profile | None = field(default=None, init=False, repr=False)
    _temps: tuple[float, ...] = field(default=(), init=False, repr=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False)  # see _round_seconds
    _ratios: dict = field(default_factory=dict, init=False, repr=False)  # (R, part) -> log(measured / priced) ...
    _factors: dict = field(default_factory=dict, init=False, repr=False)  # ... and exp(their median); see correction
    _learnt: object = field(default=None, init=False, repr=False)  # the last RoundTiming learnt from
    _rounds_learnt: int = field(default=0, init=False, repr=False)  # rounds learnt from, at any R ...
    _plain_at: dict = field(default_factory=dict, init=False, repr=False)  # ... and R -> the last vanilla one's
    _online: OnlineCalibration = field(default_factory=OnlineCalibration, init=False, repr=False)
    _pending: np.ndarray | None = field(default=None, init=False, repr=False)  # this round's confidences, to learn

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise SchedulerError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        self._table = load_profile(self.profile) if isinstance(self.profile, str) else self.profile
        self._temps = _temperatures(self.calibration)

    def keep_warmup(self, warm: Scheduler) -> None:
        if self._table is None and isinstance(warm, _Confident):
            self._table = warm._table

    def _calibrated(self, proposal: Proposal) -> np.ndarray:
        """Calibrated conditional confidences [R, k] (float64): the STS temperatures, then (``recalibrate``) the
        run's own map. Remembers the round's STS-calibrated confidences for :meth:`observe` to learn from."""
        sts = apply_temperatures(proposal.confidence.double().cpu().numpy(), self._temps)
        self._pending = sts
        return self._online.map(sts) if self.recalibrate else sts

    def observe(self, ctx: DraftContext, verified: Sequence[int], accepted: Sequence[int]) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.shape[0] == len(verified):
            self._online.add(pending, verified, accepted)

    def _survival(self, proposal: Proposal) -> np.ndarray:
        return survival(self._calibrated(proposal), proposal.lengths.cpu().numpy())

    def _round_seconds(self, ctx: DraftContext, drafted: bool = True) -> SecondsFn:
        """The round's seconds as a function of the verify shape (B tokens packed, column width L padded) at
        the batch's mean context, the drafter's propose (if ``drafted``) and the overhead included when priced,
        each part times its measured correction (``adapt``). The table of every shape a round of this batch can take is computed once per (R,
        context to 8 tokens): a scheduler asks every round, and interpolating the profile each time cost 2-3 ms
        per round on a CPU."""
        if self._table is None:
            raise SchedulerError(f"{self.name}: no profile to price a round with; give profile=PATH (`dspark-bench "
                                 f"profile` measures one) or build the scheduler with with_profile()")
        self._learn(ctx)
        rows = len(ctx.slots)
        context = _to8(float(np.mean([s.position for s in ctx.slots]))) if ctx.slots else None
        verify, draft, overhead = self._prices(rows, context, drafted, ctx.drafter, ctx.block_size)
        draft *= self.correction(rows, "draft")
        plain_at = rows if self.layout == "packed" else 0  # the shape that verifies no draft token
        plain, multi = self.correction(rows, "plain"), self.correction(rows, "multi")
        rest_plain, rest_multi = (overhead * self.correction(rows, f"other/{kind}") for kind in ("plain", "multi"))

        def seconds(shape) -> np.ndarray:
            idx = np.asarray(shape, dtype=np.int64)
            if idx.size and int(idx.max()) >= len(verify):  # a shape beyond the block (a longer proposal)
                v = self._shapes(rows, context, drafted, ctx.drafter, int(idx.max()))[0][idx]
            else:
                v = verify[idx]
            few = idx <= plain_at
            return draft + np.where(few, rest_plain, rest_multi) + v * np.where(few, plain, multi)

        return seconds

    def _prices(self, rows: int, context: float | None, drafted: bool, drafter: str,
                block: int) -> tuple[np.ndarray, float, float]:
        """:meth:`_shapes`, memoised (the profile's interpolation is the slow part of a plan)."""
        key = (rows, context, drafted, drafter, block)
        if key not in self._memo:
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = self._shapes(rows, context, drafted, drafter, block)
        return self._memo[key]

    def _shapes(self, rows: int, context: float | None, drafted: bool, drafter: str,
                block: int) -> tuple[np.ndarray, float, float]:
        """The profile's verify seconds of every shape of R = ``rows`` requests with up to ``block`` drafts each
        ([B + 1] indexed by batch tokens B (packed) or [block + 1] by column width L (padded)), the drafter's
        propose seconds (0 when not ``drafted`` or not priced) and the engine's overhead (0 when not priced)."""
        table = self._table
        draft = overhead = 0.0
        if self.costs:
            propose = table.draft_seconds(drafter, rows) if drafted else None
            draft, overhead = (0.0 if propose is None else float(propose)), float(table.overhead_seconds(rows))
        if self.layout == "packed":
            b = np.arange(rows * (block + 1) + 1)
            return 1.0 / np.asarray(table.sps(np.maximum(b, 1), context), dtype=np.float64), draft, overhead
        return np.asarray(table.verify_seconds(rows, 1 + np.arange(block + 1), context), dtype=np.float64), draft, overhead

    def correction(self, rows: int, part: str) -> float:
        """measured / priced seconds of ``part`` at R = ``rows``: "plain" (the verify forward of a round that
        verified no draft token), "multi" (one that verified some), "draft" (plan and propose), "other/plain" and
        "other/multi" (the engine's own time in either kind of round, acceptance over a wider block costing
        more). The median over the last ``ADAPT_WINDOW`` rounds of that kind. 1 before any, or without ``adapt``.

        A drafted round's parts ("multi", "draft", "other/multi") are learnt relative to the vanilla step's
        correction at that R when they were measured, and priced as today's vanilla correction times that
        ratio. The machine's speed drifts while a scheduler skips (sweep of 2026-12-03, 9c47dc5: vanilla steps at
        R = 8 ran from 0.77x to 1.25x their price in one cell); correcting only the kind it keeps measuring made
        drafts look cheap whenever the machine slowed, and noise decided (measured 2026-12-03, before 1ca18ec: at
        R = 8 the plan flipped to drafting each time the vanilla correction rose, and those rounds lost). It
        drifts while a scheduler drafts, too: once no vanilla step was measured at this R for ``ADAPT_WINDOW``
        rounds, a drafted round's verify is read as the speed (the vanilla correction) through the multi-token
        ratio already learnt, not as a new ratio. Learning the ratio against a stale speed counted a slow stretch
        twice once the vanilla steps measured it too (sweep of 2026-12-04, b6c9dbb, R = 2: after 130 drafted
        rounds the multi-token ratio was 1.13 against a vanilla correction learnt at the first round; skipping
        raised that to 1.10, drafts were priced at both, and drafting, which paid 18-30% on the prompts that
        followed, looked like break-even for 250 rounds). Drafted rounds alone cannot tell the machine's drift
        from a dearer shape; this reads it as drift (sweep of 2026-12-04, 27d3db4, R = 8: drafted rounds that
        slowed raised the vanilla correction, not the drafts' price).

        A ratio not measured at this R is borrowed from the nearest R that measured it (nearest in log2 R; of two,
        the dearer): when a cell's batch drains, every smaller R is new, and pricing its drafts at the profile's
        word drafted at a loss (sweep of 2026-12-03, 76c3209, R = 8: six drafted rounds of its tail at 39
        tokens/s against 66 for its vanilla steps).

        Where no R measured the part, it takes its sibling's at this R (plain for multi and back, and likewise
        for the overhead; "draft" takes "plain"): the machine that makes a one-token forward 1.4x its price makes
        a wider one dearer too, and correcting only the kind it has seen would make the other look cheap (sweep
        of 2026-12-03, 6f4035d: at R = 32 every vanilla step cost 1.43x its price, so drafts, priced uncorrected,
        looked worth two rounds of drafting that lost). It takes the sibling's only in the direction that
        favours not drafting: a drafted part at least 1, a plain kind at most 1. The other way round misled too
        (same sweep, R = 4: a scheduler that always drafted priced vanilla steps by the 1.1 of its multi-token
        verifies and the 3.1 of its wider acceptance, 80 ms against the 66 they cost, and kept drafting at a
        loss)."""
        factors = self._factors
        own = factors.get((rows, part))
        if part not in _DRAFTED:
            if own is not None:
                return own
            return min(factors.get((rows, _SIBLING[part]), 1.0), 1.0)
        speed = factors.get((rows, "plain"), 1.0)
        ratio = own if own is not None else self._nearest(rows, part)
        if ratio is not None:
            return speed * ratio
        return max(factors.get((rows, _SIBLING.get(part, "plain")), 1.0), 1.0)

    def _nearest(self, rows: int, part: str) -> float | None:
        """``part``'s learnt ratio at the R nearest ``rows`` (in log2 R) that measured it; of two, the larger."""
        seen = [(abs(np.log2(r / rows)), -f) for (r, p), f in self._factors.items() if p == part]
        return -min(seen)[1] if seen else None

    def _learn(self, ctx: DraftContext) -> None:
        """Compare the engine's last round (``ctx.last_round``) with the profile's price of its shape."""
        t = ctx.last_round
        if not self.adapt or t is None or t is self._learnt or not t.rows:
            return
        self._learnt = t
        self._rounds_learnt += 1
        shape = sum(t.tokens) if self.layout == "packed" else max(t.tokens) - 1  # the index _shapes prices it at
        verify, propose, overhead = self._prices(t.rows, _to8(t.context), True, ctx.drafter,
                                                 max(ctx.block_size, max(t.tokens) - 1))
        kind = "plain" if max(t.tokens) == 1 else "multi"
        if kind == "plain":
            self._plain_at[t.rows] = self._rounds_learnt
        # a drafted stretch longer than the window: the vanilla correction is stale, and the machine's drift goes
        # into the speed it stands for, through the multi-token verify's learnt ratio (see correction)
        stale = (kind == "multi" and (t.rows, "multi") in self._factors
                 and self._rounds_learnt - self._plain_at.get(t.rows, 0) > self.ADAPT_WINDOW)
        parts = [(kind, t.verify_s, float(verify[shape]))]
        if self.costs:
            if t.drafted:
                parts.append(("draft", t.draft_s, propose))  # 0 (not learnt) where the profile has no propose
            parts.append((f"other/{kind}", t.other_s, overhead))
        for part, measured, price in parts:
            if measured > 0 and price > 0:  # the median is taken here, once a round, not at every price asked
                residual = float(np.log(measured / price))
                if stale and part == "multi":
                    part, residual = "plain", residual - float(np.log(self._factors[(t.rows, "multi")]))
                elif part in _DRAFTED:  # drafted parts: relative to the speed, read after any update above
                    residual -= float(np.log(self._factors.get((t.rows, "plain"), 1.0)))
                seen = self._ratios.setdefault((t.rows, part), deque(maxlen=self.ADAPT_WINDOW))
                seen.append(residual)
                self._factors[(t.rows, part)] = float(np.exp(np.median(seen)))


@register_scheduler("hardware-aware")
@dataclass(eq=False)
class HardwareAware(_Confident):
    """Paper Algorithm 1: admit ranked candidates while Theta = E / T rises; stop at the first admission that
    does not raise it (the early stop keeps it non-anticipating, hence lossless). ``layout="padded"`` admits
    whole columns instead (module docstring). A request may get 0. Without confidences from the drafter, the
    survival measured on earlier rounds stands in for them.

    ``skip``: before drafting, compare the best Theta that the run's recent confidences promise (the measured
    survival for a drafter without them; drafter's cost included) with a vanilla round's R / T; when drafting
    does not promise ``margin`` (2%) more, the engine skips the drafter this round. The margin keeps it from
    drafting at break-even, where the prices' noise (a few percent, even corrected by ``adapt``) decides, and a
    drafted round that loses costs more than a vanilla one that does.

    With ``adapt`` and an engine that reports its rounds (``ctx.reports_rounds``, or a ``ctx.last_round``):

    * The first ``PLAIN_FIRST`` (3) rounds at each R, the run's first included, are vanilla steps: they measure
      the speed that drafts must beat and that drafted rounds' ratios are learnt against, where the profile is
      furthest off (2026-12-03, R = 4: one-token forwards at 0.67-0.79x their price, multi-token ones at 0.88x).
      Three, their median, since one slow step misprices both (2026-12-04, 27d3db4, R = 8: one step at 1.19x the
      median of the next 80 let the cell draft 18 rounds in a row at a loss, 0.886 of `none`; 2026-12-04,
      545f65a, R = 16: a drafted first round, learnt against a speed of 1, priced later drafts a quarter low).
    * After ``RETRY_AFTER`` (20) skipped rounds in a row at an R where the model puts drafting within
      ``RETRY_WITHIN`` (10%) of a vanilla step, it drafts one round, because drafted rounds' corrections stop
      learning while it skips (2026-12-03, 9c47dc5, R = 1: a slow stretch stopped drafting for 54 and then 560
      steps where it paid 18%). A retry after which the model still skips doubles the wait at that R, up to
      4 x ``RETRY_AFTER``; a round the model drafts on its own resets it (a fixed wait cost one drafted round in
      20 where drafting lost: 2026-12-03, 76c3209, R = 8 and 16).

    ``measure`` (on by default): scale every survival, in ``plan`` and ``decide``, by :meth:`kappa`, the draft
    tokens the run's drafted rounds accepted over those their survivals promised. Survivals are products of
    conditional confidences, and even calibrated one by one their product can promise more than a block
    delivers; where drafting is near break-even (on the development CPU, R = 4 and 8) a few percent decides.
    kappa pools every drafted round of the run, at any R, so it is steady after a few rounds; like the
    recalibration it learns only from earlier rounds (lossless). ``measure=false``: survivals as calibrated."""

    skip: bool = True
    prior: float = 0.5  # the measured survival's prior conditional acceptance per position
    margin: float = 0.02
    measure: bool = True
    PROMISE_PRIOR: ClassVar[float] = 10.0
    _promised: np.ndarray | None = field(default=None, init=False, repr=False)  # this round's survivals [R, k]
    _promise_total: float = field(default=0.0, init=False, repr=False)
    _accepted_total: float = field(default=0.0, init=False, repr=False)
    early_stop: ClassVar[bool] = True
    last_plan: bool | None = field(default=None, init=False)
    last_promise: float | None = field(default=None, init=False)  # the last plan's best Theta / a vanilla step's
    _counts: AcceptanceCounts = field(default_factory=AcceptanceCounts, init=False, repr=False)
    RECENT: ClassVar[int] = 64
    HALF_LIFE: ClassVar[float] = 6.0  # rounds: the weight of a recent row halves every 6 rounds of the engine
    PLAIN_FIRST: ClassVar[int] = 3  # vanilla steps measured at an R before drafts are weighed against them
    RETRY_AFTER: ClassVar[int] = 20  # skipped rounds at an R before a drafted one re-measures (adapt) ...
    RETRY_WITHIN: ClassVar[float] = 0.10  # ... if the model puts drafting within 10% of a vanilla step
    _skipped: dict = field(default_factory=dict, init=False, repr=False)  # R -> rounds skipped in a row
    _wait: dict = field(default_factory=dict, init=False, repr=False)  # R -> skipped rounds before the next retry
    _expected: tuple | None = field(default=None, init=False, repr=False)  # (key, rounds [n], survivals [n, block])
    _changes: int = field(default=0, init=False, repr=False)  # counts what _expected depends on changing
    _clock: int = field(default=0, init=False, repr=False)  # plans so far: one a round
    _recent: deque = field(default_factory=lambda: deque(maxlen=HardwareAware.RECENT), init=False, repr=False)
    LONG_RUN: ClassVar[int] = 512  # rows of confidences behind the run's mean survival, which a new request gets
    PRIOR_ROWS: ClassVar[float] = 6.0  # the run's mean's weight beside the batch's own rows (_expected_survival)
    _rows: deque = field(default_factory=lambda: deque(maxlen=HardwareAware.LONG_RUN), init=False, repr=False)
    _seen: dict = field(default_factory=dict, init=False, repr=False)  # request id -> (admission, last position)

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.prior < 1.0:
            raise SchedulerError(f"hardware-aware needs 0 < prior < 1, got {self.prior}")
        if not 0.0 <= self.margin < 1.0:
            raise SchedulerError(f"hardware-aware needs 0 <= margin < 1, got {self.margin}")

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        lengths = proposal.lengths.cpu().numpy()
        if int(lengths.max(initial=0)) == 0:
            return proposal.lengths.clone()
        if proposal.confidence is not None:
            surv = self._survival(proposal)
            keys = self._requests(ctx)
            rows = [(self._clock, keys[r], self._pending[r, : int(n)].copy()) for r, n in enumerate(lengths) if n > 0]
            self._recent.extend(rows)
            self._rows.extend(row for _, _, row in rows)
            self._changes += 1
        else:
            surv = self._measured_survival(lengths)
        self._promised = surv
        surv = (surv * self.kappa()).clip(0.0, 1.0)
        seconds = self._round_seconds(ctx, drafted=True)
        if self.layout == "packed":
            out = prefix_lengths(surv, seconds, self.early_stop)
        else:
            out = column_lengths(surv, lengths, seconds, self.early_stop)
        return torch.as_tensor(out, dtype=torch.long)

    def plan(self, ctx: DraftContext) -> bool:
        self._clock += 1
        self.last_plan, self.last_promise = True, None
        if not self.skip or not ctx.slots:
            return True
        rows, width = len(ctx.slots), ctx.block_size
        vanilla = self._round_seconds(ctx, drafted=False)  # first: it learns the last round (and finds a profile)
        measured = len(self._ratios.get((rows, "plain"), ()))
        if self.adapt and (ctx.reports_rounds or ctx.last_round is not None) and measured < self.PLAIN_FIRST:
            self.last_plan = False  # measure vanilla steps at this R before weighing drafts against them
            return False
        surv = (self._expected_survival(ctx) * self.kappa()).clip(0.0, 1.0)
        drafted = self._round_seconds(ctx, drafted=True)
        if self.layout == "packed":
            n = int(prefix_lengths(surv, drafted, early_stop=False).sum())
            best = (rows + np.sort(surv.ravel())[::-1][:n].sum()) / float(drafted(np.asarray(rows + n)))
            plain = rows / float(vanilla(np.asarray(rows)))
        else:
            best = best_column(surv, np.full(rows, width), drafted, early_stop=False)[1]
            plain = rows / float(vanilla(np.asarray(0)))
        self.last_promise = best / plain
        self.last_plan = bool(best > plain * (1.0 + self.margin))
        if not self.last_plan and self.adapt:
            skipped = self._skipped[rows] = self._skipped.get(rows, 0) + 1
            wait = self._wait.get(rows, self.RETRY_AFTER)
            if skipped >= wait and best > plain * (1.0 - self.RETRY_WITHIN):
                self._skipped[rows], self._wait[rows] = 0, min(2 * wait, 4 * self.RETRY_AFTER)  # waits longer ...
                self.last_plan = True  # re-measure drafted rounds: their corrections stop learning while skipped
        elif self.last_plan:
            self._skipped[rows], self._wait[rows] = 0, self.RETRY_AFTER  # ... unless the model drafts on its own
        return self.last_plan

    def observe(self, ctx: DraftContext, verified: Sequence[int], accepted: Sequence[int]) -> None:
        super().observe(ctx, verified, accepted)
        if any(verified):
            self._changes += 1  # the calibration learnt (see _expected_survival)
        self._counts.add(verified, accepted)
        promised, self._promised = self._promised, None
        if promised is not None and promised.shape[0] == len(verified):
            held = np.arange(promised.shape[1])[None, :] < np.asarray(verified)[:, None]  # as the engine capped it
            self._promise_total += float(promised[held].sum())
            self._accepted_total += float(sum(accepted))

    def kappa(self) -> float:
        """Draft tokens accepted / draft tokens the survivals promised, over the run's drafted rounds (a prior of
        ``PROMISE_PRIOR`` tokens at 1); 1 without ``measure``."""
        if not self.measure:
            return 1.0
        return (self._accepted_total + self.PROMISE_PRIOR) / (self._promise_total + self.PROMISE_PRIOR)

    def _measured_survival(self, lengths: np.ndarray) -> np.ndarray:
        """[R, max length] survivals from the measured conditional acceptance ``h``, zero beyond each length."""
        return survival(np.tile(self._counts.conditional(int(lengths.max()), self.prior), (len(lengths), 1)),
                        lengths)

    def _requests(self, ctx: DraftContext) -> list[tuple]:
        """A key per slot naming the request in it: its id and its admission. An engine gives a request the same
        id in every repeat of a run, and one scheduler serves every repeat, so a slot whose position went back is
        a new request (a request's position only grows)."""
        keys = []
        for slot in ctx.slots:
            admission, last = self._seen.get(slot.request_id, (0, None))
            if last is not None and slot.position < last:
                admission += 1
            self._seen[slot.request_id] = admission, slot.position
            keys.append((slot.request_id, admission))
        return keys

    def _expected_survival(self, ctx: DraftContext) -> np.ndarray:
        """[R, block] survivals a round drafted now is expected to offer every request: the mean over the batch of
        each request's expectation. A request in the batch that proposed confidences among the last ``RECENT``
        rows expects their mean survival, the rows of every such request pooled and each row weighed by its age in
        rounds (halved every ``HALF_LIFE``), through today's calibration, with the run's mean survival over its
        last ``LONG_RUN`` rows of any request beside them at the weight of ``PRIOR_ROWS`` rows. A request with no
        such row, one just admitted, expects the run's mean; before any row (or for a drafter that predicts no
        confidences), the measured survival ``h``. The run's mean keeps one unlucky first round from deciding for
        a new request: replayed through the simulation on the five committed sweeps of 2026-12-03
        (``baselines/scheduling-smollm2/README.md``), the batch's own rows alone lost up to 4% at R = 1 where
        drafting pays.

        The rows of requests that have left the batch stand for prompts that are gone, so a new request does not
        inherit them. Inherited (before 4984501, 2026-12-04), they held back the sweep of 8de582d (2026-12-03) at
        R = 2: its second repeat began on the rows of the first repeat's last, hard requests (first-position
        survival 0.23, drafting promised 0.95 of a vanilla step), and the scheduler skipped its first 65 rounds,
        with new requests in the batch, where drafting paid 15%.
        The weights make a retry's rows count after a long skip: unweighted, the rows of the last drafted
        stretch stood for the request long after it had changed (sweep of 2026-12-03, 687cfe2, R = 1: drafting
        stopped on AIME 2025, where drafts lost, and one retry's row in 64 could not show that on HumanEval they
        paid 28%).
        Not each request's own last confidences: drafting where the last round was confident selects on a high
        draw that the next round does not repeat (measured 2026-12-03, R = 4: the rounds so chosen cost 137 ms
        for 6.7 tokens, 49 tokens/s against the 57 of vanilla steps), and a skipped request's confidences never
        refresh."""
        rows, width = len(ctx.slots), ctx.block_size
        keys = self._requests(ctx)
        if not self._recent:
            return self._measured_survival(np.full(rows, width))
        key = (self._changes, width)  # unchanged while the scheduler skips: computed once, not every vanilla step
        if self._expected is None or self._expected[0] != key:
            self._expected = key, *self._row_survivals(width)
        _, stamps, owners, surv, overall = self._expected
        live = set(keys)
        mine = np.array([o in live for o in owners], dtype=bool)
        known = len(live & set(owners))  # requests in the batch with recent rows (the keys of a batch differ)
        if not known:
            return np.tile(overall, (rows, 1))
        weights = 0.5 ** ((stamps[mine].max() - stamps[mine]) / self.HALF_LIFE)  # ages from the newest row: it weighs 1
        recent = (weights @ surv[mine] + self.PRIOR_ROWS * overall) / (weights.sum() + self.PRIOR_ROWS)
        return np.tile((known * recent + (rows - known) * overall) / rows, (rows, 1))

    def _row_survivals(self, width: int) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
        """The recent rows' rounds [n], requests [n] and survivals [n, width], and the mean survival [width] of the
        last ``LONG_RUN`` rows, all through today's calibration."""

        def survivals(rows) -> np.ndarray:
            conf, held = np.zeros((len(rows), width)), np.zeros((len(rows), width), dtype=bool)
            for i, row in enumerate(rows):
                conf[i, : len(row[:width])], held[i, : len(row[:width])] = row[:width], True
            mapped = np.where(held, self._online.map(conf) if self.recalibrate else conf, 0.0)
            return np.cumprod(mapped, axis=1)

        return (np.array([t for t, _, _ in self._recent], dtype=np.float64), [k for _, k, _ in self._recent],
                survivals([row for _, _, row in self._recent]), survivals(self._rows).mean(axis=0))


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
        seconds = self._round_seconds(ctx)
        if self.layout == "packed":
            return best_capacity(surv, seconds)
        return best_column(surv, np.full(len(lagged), width), seconds, early_stop=False)[0]

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

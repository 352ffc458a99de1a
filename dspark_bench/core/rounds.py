"""The round's data types: what goes into the engine (:class:`Request`) and what comes out of it
(:class:`RoundStats` per round, :class:`RequestResult` per request).

Plain frozen dataclasses with no torch and no package imports, so that results, metrics, calibration, schedulers
and the engine can all depend on them without depending on each other (and importing ``gate`` or ``metrics``
loads no model code).

Time fields of a round (seconds, the round's shared wall time; see :mod:`dspark_bench.evaluation.metrics` for the metrics
built on them):

* ``draft_s``: the scheduler's ``plan`` and the drafter's ``propose`` (its forwards, its sampling, its
  bookkeeping); near 0 in a round where the scheduler skipped the drafter (``proposed`` is 0 then);
* ``verify_s``: the target's verify forward;
* ``other_s``: everything else in the round (scheduling, acceptance, sampling the target's token, commit);
* ``head_s``: the part of ``draft_s`` spent computing the Markov head (DSpark; 0 for other drafters);
* ``draft_forward_s``: the drafter's model forwards in the round (in ``propose`` and in ``commit``, ``head_s``
  included), so ``verify_s + draft_forward_s`` is the round's model time and the rest is engine overhead;
* ``sample_s``: the part of ``draft_s`` spent drawing draft tokens (the one batched sampler, every drafter alike).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    request_id: int
    prompt_ids: tuple[int, ...]
    seed: int  # keys every random draw of the request (see dspark_bench.core.rng)
    dataset: str = ""
    domain: str = ""
    prompt_id: str = ""
    arrival_s: float | None = None  # open-loop load: when it arrives, s from the session's start; None: closed loop


@dataclass(frozen=True)
class RoundStats:
    """One draft-verify round of one request. Times: see the module docstring."""

    proposed: int  # draft tokens the drafter offered
    verified: int  # draft tokens sent to the target (l)
    accepted: int  # draft tokens that survived (A)
    committed: int  # tokens appended: A + 1, or A when an accepted EOS ended the request (tau of the round)
    draft_s: float
    verify_s: float
    other_s: float
    head_s: float = 0.0
    draft_forward_s: float = 0.0
    sample_s: float = 0.0
    confidence: tuple[float, ...] | None = None  # c_1..c_proposed, when the drafter predicts them
    batch: int = 1  # requests in the batch this round
    cache_columns: int = 0  # width of the target's KV cache after the round (bounded-cache checks)
    waiting: int = 0  # requests still queued (not yet admitted) during the round

    @property
    def round_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s


@dataclass(frozen=True)
class Served:
    """When an open-loop request arrived, was admitted and got its tokens, in seconds on its session's clock
    (:class:`~dspark_bench.core.timing.StepClock`). ``delivered_s``: the end of its admission (the first token),
    then the end of every round it took part in (each commits at least one token); empty when it failed before
    its first token."""

    arrival_s: float
    admitted_s: float
    delivered_s: tuple[float, ...]


@dataclass(frozen=True)
class RequestResult:
    request: Request
    status: str  # "ok" or "error"
    output_ids: tuple[int, ...]
    rounds: tuple[RoundStats, ...]
    ttft_s: float  # prefill: admission to first token, the drafter's prompt processing included
    decode_s: float  # sum of the request's rounds' wall times
    finish: str  # "eos", "length" or "error"
    error: str | None = None
    served: Served | None = None  # open-loop load only

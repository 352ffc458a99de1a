"""The one speculative-decoding loop, batched over R concurrent requests and resident on the target's device.

Every method runs through :class:`RoundLoop`: vanilla decoding is the drafter that proposes nothing. A round is

1. **draft**: the drafter proposes a block for every active request (tokens and q stay on the device), unless
   the scheduler's ``plan`` says from what is already known that no draft would pay this round: then the
   drafter is skipped and every request verifies nothing (a vanilla decoding step). Such a step first reclaims
   the dead columns beyond the longest row (left where a shorter row kept more of its block than the longest
   did; ``compact`` otherwise tolerates a block of them), so it attends over what `none` would. The first
   skipped round pays the copy; the next ones find nothing to move. (On the development CPU, 2026-12-03, R = 4,
   one small A/B run each: vanilla steps after drafted rounds took a median 67.4 ms against `none`'s 61.5
   without it and 65.3 against 64.8 with it; in the full sweep after it, medians 0.1-0.4% apart at R = 1, 8 and 16.)
2. **schedule**: the scheduler picks each request's verify length (capped by its remaining token budget);
3. **verify**: one target forward over ``[current, x_1..x_l]`` for all requests at once;
4. **accept**: one vectorised acceptance step (:mod:`dspark_bench.core.verify`) for all R requests decides survivors
   and draws the target's token, with uniforms keyed by (request seed, position, purpose) (:mod:`.rng`);
5. **commit**: one small device-to-host copy (accepted counts, tokens, confidences), tokens are appended,
   rejected cache slots become holes (reclaimed by :meth:`Target.compact`), the drafter is told.

Requests join as slots free up (continuous batching: ``concurrency`` requests stay in flight until the queue
runs dry); a finished request leaves and its result is handed to ``on_result`` at once, so a crash later never
loses it. Under open-loop load the requests carry arrival times: a request joins at the first step after it
arrives (admission happens between rounds), at most ``concurrency`` in flight (``--max-concurrency``), and a
session with nothing in flight moves its clock to the next arrival (:class:`~dspark_bench.core.timing.StepClock`,
which runs only during the session's own steps). Each request then records its arrival, its admission and the
end of its admission and of each of its rounds, its token deliveries (:class:`~dspark_bench.core.rounds.Served`).
:meth:`RoundLoop.session` exposes the loop one step at a time so that a runner can interleave several engines
round by round (see :mod:`dspark_bench.engines.native.runner`).

Randomness: the first token after a prompt ending at position n, and the recovered/bonus token of a round whose
current token is at position n, use key (seed, n, TARGET); the test of draft x_j at position n + j uses
(seed, n + j, ACCEPT); drafters draw x_j with (seed, n + j, DRAFT). So a request's tokens do not depend on the
batch it shares, on the concurrency or on the admission order.

Times (see :mod:`dspark_bench.core.rounds`): TTFT spans admission (prefill, first token, the drafter's ``begin``);
a round's ``draft_s`` (plan and propose) / ``verify_s`` (the target's forward) / ``other_s`` (scheduling,
acceptance, commit) split its wall time, and the drafter's forward, Markov-head
and sampling spans are read from :class:`~dspark_bench.core.timing.Timer`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from dspark_bench.core import rng
from dspark_bench.core.rounds import Request, RequestResult, RoundStats, Served
from dspark_bench.core.timing import StepClock, Timer
from dspark_bench.core.verify import (
    AcceptRule,
    Draws,
    Sampling,
    Verdict,
    sample,
    speculative_accept,
    to_probs,
)
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal, RoundTiming, Slot
from dspark_bench.scheduling.schedulers import Fixed, Scheduler
from dspark_bench.target.model import KVBatch, Target, to_device

__all__ = ["RoundLoop", "EngineConfig", "Request", "RequestResult", "RoundStats", "Session"]


@dataclass(frozen=True)
class EngineConfig:
    max_new_tokens: int = 256
    temperature: float = 1.0
    block_size: int = 7
    concurrency: int = 1
    top_p: float = 1.0  # the filters of :class:`~dspark_bench.core.verify.Sampling` (1, 0, 0: off)
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:  # NaN passes `< 0` and samples garbage
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        self.sampling  # noqa: B018 - validates the filters
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1, got {self.block_size}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def sampling(self) -> Sampling:
        """How p and q are made from logits: the temperature and the filters, for the target and the drafter."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.min_p)


@dataclass(eq=False)
class _Live:
    request: Request
    slot: Slot
    ttft_s: float = 0.0
    decode_s: float = 0.0
    output: list[int] = field(default_factory=list)
    rounds: list[RoundStats] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    admitted_s: float | None = None  # open-loop load: on the session's clock
    delivered_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Host:
    """What one round copies to the host: verdicts, the verified draft tokens and the confidences."""

    verdicts: list[Verdict]
    drafts: list[list[int]]  # [R][k] verified-width draft tokens
    confidence: list[list[float]] | None


class RoundLoop:
    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        config: EngineConfig,
        scheduler: Scheduler | None = None,
        accept: AcceptRule = speculative_accept,
    ):
        self.target, self.drafter, self.config = target, drafter, config
        self.scheduler = scheduler or Fixed()
        self.accept = accept
        self.taps = tuple(drafter.feature_layers)
        self.eos = torch.tensor(sorted(target.eos_ids), dtype=torch.long, device=target.device)

    def run(self, requests: Iterable[Request], on_result: Callable[[RequestResult], None]) -> None:
        """Decode every request; ``on_result`` receives each result as soon as the request ends."""
        session = self.session(requests, on_result)
        while session.step():
            pass

    def session(self, requests: Iterable[Request], on_result: Callable[[RequestResult], None]) -> Session:
        return Session(self, deque(requests), on_result)


class Session:
    """One pass of an engine over a queue of requests, advanced one step (admit, one round, retire) at a time."""

    def __init__(self, engine: RoundLoop, queue: deque[Request], on_result: Callable[[RequestResult], None]):
        self.engine, self.queue, self.on_result = engine, queue, on_result
        self.target, self.drafter, self.config = engine.target, engine.drafter, engine.config
        self.timer = Timer(self.target.device)
        self.ctx = DraftContext(self.target, self.config.sampling, self.config.block_size, timer=self.timer,
                                drafter=getattr(self.drafter, "name", ""), reports_rounds=True, scratch={})
        self.live: list[_Live] = []
        self.batch: KVBatch | None = None
        self.laws = Scratch(self.target.device)  # the round's target law p, in the same memory every round
        self.clock = _open_loop_clock(queue, self.target.device)  # None: closed-loop load

    @property
    def done(self) -> bool:
        return not self.queue and not self.live

    def step(self) -> bool:
        """Admit what fits, run one round, retire what finished. False once the queue and the batch are empty.

        Inference mode throughout: nothing here is differentiated, and it spares every small tensor operation of
        a round autograd's bookkeeping (about a fifth of the acceptance step's time at one row on the CPU)."""
        if self.done:
            return False
        with torch.inference_mode(), (self.clock.running() if self.clock else nullcontext()):
            joining = self._arrived(self.config.concurrency - len(self.live))
            if joining:
                self._admit(joining)
            if self.live and all(item.finish is None for item in self.live):
                self._round_or_fail()
                self._delivered(self.live)
            self._retire()
        return not self.done

    # ---- arrivals (open-loop load) --------------------------------------------------------------------------
    def _arrived(self, free: int) -> list[Request]:
        """Who joins the batch now, at most ``free``: closed loop, the next of the queue; open loop, those that
        have arrived by the session's clock, in arrival order. A session with nothing in flight first waits for
        its next arrival (:meth:`StepClock.wait_until`: its clock moves on, nothing spins and nothing sleeps)."""
        if free <= 0 or not self.queue:
            return []
        if self.clock is None:
            return [self.queue.popleft() for _ in range(min(free, len(self.queue)))]
        if not self.live:
            self.clock.wait_until(self.queue[0].arrival_s)
        now, out = self.clock.now(), []
        while self.queue and len(out) < free and self.queue[0].arrival_s <= now:
            out.append(self.queue.popleft())
        return out

    def _waiting(self) -> int:
        """Requests queued for a slot: the whole queue in closed loop, the arrived ones in open loop."""
        if self.clock is None:
            return len(self.queue)
        now = self.clock.now()
        return next((i for i, r in enumerate(self.queue) if r.arrival_s > now), len(self.queue))

    def _delivered(self, items: list[_Live]) -> None:
        """Open loop: ``items`` received tokens now (the end of an admission or of a round)."""
        if self.clock is not None:
            now = self.clock.now()
            for item in items:
                item.delivered_s.append(now)

    # ---- admission ------------------------------------------------------------------------------------------
    def _admit(self, joining: list[Request]) -> None:
        """Prefill ``joining`` together, sample each first token, and merge them into the running batch."""
        timer, device = self.timer, self.target.device
        admitted = self.clock.now() if self.clock else None
        t0 = timer.mark()
        try:
            new_batch, out = self.target.prefill([list(r.prompt_ids) for r in joining], self.engine.taps)
            u = to_device(rng.uniforms([r.seed for r in joining], [len(r.prompt_ids) - 1 for r in joining],
                                       rng.TARGET), device)  # [J]
            first = sample(to_probs(out.logits[:, -1], self.ctx.sampling), u).tolist()  # the one D2H copy
            items = []
            for r, (req, tok) in enumerate(zip(joining, first, strict=True)):
                slot = Slot(req.request_id, [*req.prompt_ids, tok], len(req.prompt_ids), req.seed)
                slot.new_features = out.features[r]
                items.append(_Live(req, slot, output=[tok]))
            self.drafter.begin(self.ctx, [i.slot for i in items])
        except Exception as exc:  # noqa: BLE001 - a failed request is recorded, never fatal for the run
            timer.clear()
            for req in joining:
                self.on_result(_failed(req, exc, admitted))
            return
        if self.batch is None:
            self.batch = self.target.new_batch()
        self.target.merge(self.batch, new_batch)
        self._compact()
        ttft = timer.seconds(t0, timer.mark())
        timer.clear()
        for item in items:
            item.ttft_s, item.admitted_s = ttft, admitted
            self._check_done(item)
        self._delivered(items)
        self.live.extend(items)
        self.ctx.slots = [i.slot for i in self.live]

    # ---- one round ------------------------------------------------------------------------------------------
    def _round_or_fail(self) -> None:
        try:
            self._round()
        except Exception as exc:  # noqa: BLE001
            for item in self.live:
                item.finish, item.error = "error", f"{type(exc).__name__}: {exc}"
        finally:
            self.timer.clear()

    def _round(self) -> None:
        ctx, live, timer, waiting = self.ctx, self.live, self.timer, self._waiting()
        scheduler = self.engine.scheduler
        context = float(np.mean([i.slot.position for i in live]))
        t0 = timer.mark()
        planned = scheduler.plan(ctx)
        proposal = self.drafter.propose(ctx) if planned else Proposal.empty(len(live))  # 1. draft
        if not planned:
            self._compact(slack=0)  # a vanilla step attends over no dead column (module docstring)
        t1 = timer.mark()
        lengths = self._verify_lengths(proposal)  # 2. schedule
        ts = timer.mark()
        width = max(lengths)
        device = self.target.device
        draft = to_device(proposal.tokens[:, :width], device)  # [R, k]
        # the round's host values in two host-to-device copies: current token and verify length; the uniforms
        current, lens = to_device([[i.slot.tokens[-1], n] for i, n in zip(live, lengths, strict=True)], device).T
        u = to_device(self._accept_uniforms(width), device)  # [R, k+1]
        ids = torch.cat([current.unsqueeze(1), draft], 1)  # [R, k+1]
        out = self.target.forward_block(self.batch, ids, [n + 1 for n in lengths], self.engine.taps)  # 3. verify
        t2 = timer.mark()
        host = self._accept(out.logits, proposal, draft, lens, u)  # 4. accept (+ one D2H copy)
        scheduler.observe(ctx, lengths, [v.accepted for v in host.verdicts])
        self.target.keep(self.batch, [v.accepted + 1 for v in host.verdicts])  # 5. commit
        for r, (item, v) in enumerate(zip(live, host.verdicts, strict=True)):
            self._commit(item, host.drafts[r], v)
            item.slot.new_features = out.features[r].head(v.accepted + 1)
        self.drafter.commit(ctx, ctx.slots, host.verdicts)
        self._compact()
        t3 = timer.mark()
        self._record(proposal, lengths, host, (t0, t1, ts, t2, t3), waiting, (planned, context))

    def _verify_lengths(self, proposal: Proposal) -> list[int]:
        chosen = self.engine.scheduler.decide(proposal, self.ctx).tolist()
        proposed = proposal.lengths.tolist()
        out = []
        for r, item in enumerate(self.live):
            if not 0 <= chosen[r] <= proposed[r]:
                raise ValueError(f"scheduler chose {chosen[r]} of {proposed[r]} proposed tokens")
            remaining = self.config.max_new_tokens - len(item.output)
            out.append(min(chosen[r], remaining - 1))
        return out

    def _accept_uniforms(self, width: int) -> torch.Tensor:
        """[R, k+1] host uniforms of a round verifying up to k = ``width`` drafts: the tests of x_1..x_k (ACCEPT at
        the current position + j), then the target's own token (TARGET at the current position)."""
        anchor = np.array([i.slot.position for i in self.live], dtype=np.int64)
        offsets = np.roll(np.arange(width + 1), -1)  # 1..k, then 0
        return rng.uniforms([i.slot.seed for i in self.live], anchor[:, None] + offsets,
                            [rng.ACCEPT] * width + [rng.TARGET])

    def _accept(self, logits: torch.Tensor, proposal: Proposal, draft: torch.Tensor, lens: torch.Tensor,
                u: torch.Tensor) -> _Host:
        """4. accept: target law p at the k+1 slots vs the draft law q, all R requests in one step. ``lens``: verify
        lengths [R], ``u``: the round's uniforms [R, k+1] (:meth:`_accept_uniforms`), both on the device."""
        width, device = draft.shape[1], self.target.device
        block = logits[:, : width + 1]
        p = to_probs(block, self.ctx.sampling, out=self.laws.take(block.shape))  # [R, k+1, V], processed as q is
        q = None if proposal.q is None else to_device(proposal.q[:, :width], device)
        draws = Draws(u[:, :width], u[:, width])
        v = self.engine.accept(p, draft, q, lens, draws, self.engine.eos)
        conf = proposal.confidence
        parts = [torch.stack([v.accepted, v.token, v.eos.long()], 1), draft]  # [R, 3], [R, k]
        if conf is not None:
            parts.append(to_device(conf, device))  # [R, G]
        packed = torch.cat([x.double() for x in parts], 1).cpu().tolist()  # the round's one device-to-host copy
        verdicts = [Verdict(int(a), None if e else int(t), bool(e)) for a, t, e, *_ in packed]
        drafts = [[int(x) for x in row[3 : 3 + width]] for row in packed]
        confidence = None if conf is None else [row[3 + width :] for row in packed]
        return _Host(verdicts, drafts, confidence)

    def _commit(self, item: _Live, drafts: list[int], v: Verdict) -> None:
        new = drafts[: v.accepted] + ([v.token] if v.token is not None else [])
        item.output.extend(new)
        item.slot.tokens.extend(new)
        if v.eos:
            item.finish = "eos"
        self._check_done(item)

    def _record(self, proposal: Proposal, lengths: list[int], host: _Host, marks, waiting: int,
                plan: tuple[bool, float]) -> None:
        timer = self.timer
        t0, t1, ts, t2, t3 = marks  # draft | schedule | verify forward | accept and commit
        draft_s, verify_s = timer.seconds(t0, t1), timer.seconds(ts, t2)
        other_s = timer.seconds(t1, ts) + timer.seconds(t2, t3)
        last = self.ctx.last_round
        self.ctx.last_round = RoundTiming((last.index if last else 0) + 1, len(self.live), tuple(n + 1 for n in lengths),
                                          plan[1], plan[0], draft_s, verify_s, other_s)
        spans = timer.totals()
        proposed = proposal.lengths.tolist()
        for r, (item, v) in enumerate(zip(self.live, host.verdicts, strict=True)):
            conf = None if host.confidence is None else tuple(host.confidence[r][: proposed[r]])
            item.rounds.append(RoundStats(
                proposed=proposed[r], verified=lengths[r], accepted=v.accepted, committed=v.committed,
                draft_s=draft_s, verify_s=verify_s, other_s=other_s, head_s=spans["head"],
                draft_forward_s=spans["forward"] + spans["head"], sample_s=spans["sample"], confidence=conf,
                batch=len(self.live), cache_columns=getattr(self.batch, "columns", 0), waiting=waiting,
            ))
            item.decode_s += draft_s + verify_s + other_s

    def _check_done(self, item: _Live) -> None:
        if item.finish is None and item.output[-1] in self.target.eos_ids:
            item.finish = "eos"
        elif item.finish is None and len(item.output) >= self.config.max_new_tokens:
            item.finish = "length"

    def _compact(self, slack: int | None = None) -> None:
        """Keep the cache within the longest live row plus ``slack`` columns (default one block, ``block_size + 1``)."""
        if self.batch is not None and hasattr(self.target, "compact"):
            self.target.compact(self.batch, self.config.block_size + 1 if slack is None else slack)

    # ---- retirement -----------------------------------------------------------------------------------------
    def _retire(self) -> None:
        done = [r for r, item in enumerate(self.live) if item.finish is not None]
        if not done:
            return
        leaving = [self.live[r] for r in done]
        try:
            self.drafter.end(self.ctx, [i.slot for i in leaving])
        finally:
            self.live[:] = [item for item in self.live if item.finish is None]
            if self.live:
                self.target.drop(self.batch, done)
                self._compact()
            else:
                self.batch = None
            self.ctx.slots = [i.slot for i in self.live]
            for item in leaving:
                self.on_result(_result(item))


class Scratch:
    """One float32 buffer handed out round after round as a tensor of the round's shape (a view of its first
    elements, grown when a round needs more), for the loop's largest per-round tensor outside the forwards: the
    target's law over [R, k+1, V] (14 MB at R = 8 and k = 8). Made fresh, it and its float32 copy of bf16 logits
    were two such allocations a round; under the process's allocator policy (``target/allocator.py``) they mostly
    land on pages already touched, but not always: in a process's first rounds one such law took 1,700 page faults
    (10-20 ms, against 2 ms for the softmax), and DSpark at concurrency 32 still took 11,000 faults in a 16-prompt
    session. Measured against fresh tensors (``baselines/engine-ab-scratch/``, bf16, alternated in one process)
    with the drafters' draft laws reused too (``DraftContext.scratch``), DSpark's overhead share fell by about half
    a point (7.8 -> 7.2%, 7.0 -> 6.5%, 7.2 -> 6.7% at 1 / 8 / 32); throughput moved within the noise. A tensor
    taken from it is valid until the next ``take``."""

    def __init__(self, device):
        self.device, self._flat = device, None

    def take(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        if self._flat is None or self._flat.numel() < n:
            self._flat = torch.empty(n, dtype=torch.float32, device=self.device)
        return self._flat[:n].view(shape)


def _result(item: _Live) -> RequestResult:
    status = "error" if item.finish == "error" else "ok"
    served = (None if item.admitted_s is None
              else Served(item.request.arrival_s, item.admitted_s, tuple(item.delivered_s)))
    return RequestResult(
        item.request, status, tuple(item.output), tuple(item.rounds), item.ttft_s, item.decode_s,
        item.finish or "length", item.error, served,
    )


def _failed(req: Request, exc: BaseException, admitted: float | None = None) -> RequestResult:
    served = None if admitted is None else Served(req.arrival_s, admitted, ())
    return RequestResult(req, "error", (), (), 0.0, 0.0, "error", f"{type(exc).__name__}: {exc}", served)


def _open_loop_clock(queue: deque[Request], device) -> StepClock | None:
    """A session's clock when its requests carry arrival times (open-loop load), None when none do; they must
    come in arrival order."""
    times = [r.arrival_s for r in queue]
    if all(t is None for t in times):
        return None
    if any(t is None for t in times) or any(a > b for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("open-loop requests need an arrival time each, in arrival order (a closed-loop request "
                         "has none)")
    return StepClock(device)

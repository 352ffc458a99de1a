"""The one speculative-decoding loop, batched over R concurrent requests.

Every method runs through :class:`Engine`: vanilla decoding is the drafter that proposes nothing. A round is

1. **draft**: the drafter proposes a block for every active request;
2. **schedule**: the scheduler picks each request's verify length (capped by its remaining token budget);
3. **verify**: one target forward over ``[current, x_1..x_l]`` for all requests at once;
4. **accept**: the acceptance rule (:mod:`dspark_bench.verify`) decides survivors and the target's token;
5. **commit**: tokens are appended, rejected cache slots become holes, the drafter is told.

Requests join as slots free up (continuous batching up to ``concurrency``); a finished request leaves and its
result is handed to ``on_result`` at once, so a crash later never loses it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from dspark_bench.drafters.base import DraftContext, Drafter, Proposal, Slot
from dspark_bench.schedulers import Fixed, Scheduler
from dspark_bench.target import KVBatch, Target
from dspark_bench.verify import AcceptRule, Verdict, sample, speculative_accept, to_probs


@dataclass(frozen=True)
class Request:
    request_id: int
    prompt_ids: tuple[int, ...]
    seed: int
    dataset: str = ""
    domain: str = ""
    prompt_id: str = ""


@dataclass(frozen=True)
class EngineConfig:
    max_new_tokens: int = 256
    temperature: float = 1.0
    block_size: int = 7
    concurrency: int = 1

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1, got {self.block_size}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class RoundStats:
    """One draft-verify round of one request. Times are the round's shared wall times in seconds."""

    proposed: int  # draft tokens the drafter offered
    verified: int  # draft tokens sent to the target (l)
    accepted: int  # draft tokens that survived (A)
    committed: int  # tokens appended: A + 1, or A when an accepted EOS ended the request (tau of the round)
    draft_s: float
    verify_s: float
    other_s: float
    sequential_s: float = 0.0
    confidence: tuple[float, ...] | None = None  # c_1..c_proposed, when the drafter predicts them
    batch: int = 1  # requests in the batch this round


@dataclass(frozen=True)
class RequestResult:
    request: Request
    status: str  # "ok" or "error"
    output_ids: tuple[int, ...]
    rounds: tuple[RoundStats, ...]
    ttft_s: float
    decode_s: float
    finish: str  # "eos", "length" or "error"
    error: str | None = None


@dataclass(eq=False)
class _Live:
    request: Request
    slot: Slot
    started: float
    ttft_s: float = 0.0
    decode_s: float = 0.0
    output: list[int] = field(default_factory=list)
    rounds: list[RoundStats] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None


class Engine:
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

    def run(self, requests: Iterable[Request], on_result: Callable[[RequestResult], None]) -> None:
        """Decode every request; ``on_result`` receives each result as soon as the request ends."""
        queue = deque(requests)
        ctx = DraftContext(self.target, self.config.temperature, self.config.block_size)
        live: list[_Live] = []
        batch: KVBatch | None = None
        while queue or live:
            free = self.config.concurrency - len(live)
            if free > 0 and queue:
                joining = [queue.popleft() for _ in range(min(free, len(queue)))]
                batch = self._admit(ctx, batch, live, joining, on_result)
            if live and all(item.finish is None for item in live):
                self._round_or_fail(ctx, batch, live)
            batch = self._retire(ctx, batch, live, on_result)

    # ---- admission ------------------------------------------------------------------------------------------
    def _admit(self, ctx, batch, live, joining, on_result) -> KVBatch | None:
        """Prefill ``joining`` together, sample each first token, and merge them into the running batch."""
        t0 = self._clock()
        try:
            new_batch, out = self.target.prefill([list(r.prompt_ids) for r in joining], self.taps)
            items = []
            for r, req in enumerate(joining):
                gen = torch.Generator().manual_seed(req.seed)
                first = sample(to_probs(out.logits[r, -1].float().cpu(), self.config.temperature), gen)
                slot = Slot(req.request_id, [*req.prompt_ids, first], len(req.prompt_ids), gen)
                slot.new_features = out.features[r]
                items.append(_Live(req, slot, t0, output=[first]))
            self.drafter.begin(ctx, [i.slot for i in items])
        except Exception as exc:  # noqa: BLE001 - a failed request is recorded, never fatal for the run
            for req in joining:
                on_result(_failed(req, exc))
            return batch
        if batch is None:
            batch = self.target.new_batch()
        self.target.merge(batch, new_batch)
        ttft = self._clock() - t0
        for item in items:
            item.ttft_s = ttft
            self._check_done(item)
        live.extend(items)
        ctx.slots = [i.slot for i in live]
        return batch

    # ---- one round ------------------------------------------------------------------------------------------
    def _round_or_fail(self, ctx, batch, live) -> None:
        try:
            self._round(ctx, batch, live)
        except Exception as exc:  # noqa: BLE001
            for item in live:
                item.finish, item.error = "error", f"{type(exc).__name__}: {exc}"

    def _round(self, ctx: DraftContext, batch: KVBatch, live: list[_Live]) -> None:
        t0 = self._clock()
        proposal = self.drafter.propose(ctx)  # 1. draft
        t1 = self._clock()
        lengths = self._verify_lengths(proposal, ctx, live)  # 2. schedule
        blocks = [[item.slot.tokens[-1], *proposal.tokens[r, : lengths[r]].tolist()] for r, item in enumerate(live)]
        out = self.target.forward_block(batch, blocks, self.taps)  # 3. verify forward
        t2 = self._clock()
        verdicts = [self._accept(out.logits[r], proposal, r, lengths[r], item) for r, item in enumerate(live)]
        self.target.keep(batch, [v.accepted + 1 for v in verdicts])  # 5. commit (cache)
        for r, (item, v) in enumerate(zip(live, verdicts, strict=True)):
            self._commit(item, proposal, r, v)
            item.slot.new_features = out.features[r].head(v.accepted + 1)
        self.drafter.commit(ctx, ctx.slots, verdicts)
        t3 = self._clock()
        for r, (item, v) in enumerate(zip(live, verdicts, strict=True)):
            conf = proposal.confidence
            item.rounds.append(
                RoundStats(
                    proposed=int(proposal.lengths[r]),
                    verified=lengths[r],
                    accepted=v.accepted,
                    committed=v.committed,
                    draft_s=t1 - t0,
                    verify_s=t2 - t1,
                    other_s=t3 - t2,
                    sequential_s=proposal.sequential_s,
                    confidence=None if conf is None else tuple(conf[r, : int(proposal.lengths[r])].float().tolist()),
                    batch=len(live),
                )
            )
            item.decode_s += t3 - t0

    def _verify_lengths(self, proposal: Proposal, ctx: DraftContext, live: list[_Live]) -> list[int]:
        chosen = self.scheduler.decide(proposal, ctx).tolist()
        out = []
        for r, item in enumerate(live):
            if not 0 <= chosen[r] <= int(proposal.lengths[r]):
                raise ValueError(f"scheduler chose {chosen[r]} of {int(proposal.lengths[r])} proposed tokens")
            remaining = self.config.max_new_tokens - len(item.output)
            out.append(min(chosen[r], remaining - 1))
        return out

    def _accept(self, logits: torch.Tensor, proposal: Proposal, r: int, n: int, item: _Live) -> Verdict:
        """4. accept: target law p at the n+1 real slots vs the draft law q of the n verified tokens."""
        p = to_probs(logits[: n + 1].float().cpu(), self.config.temperature)
        draft = proposal.tokens[r, :n].cpu()
        q = None if proposal.q is None else proposal.q[r, :n].float().cpu()
        return self.accept(p, draft, q, item.slot.generator, self.target.eos_ids)

    def _commit(self, item: _Live, proposal: Proposal, r: int, v: Verdict) -> None:
        new = proposal.tokens[r, : v.accepted].tolist() + ([v.token] if v.token is not None else [])
        item.output.extend(new)
        item.slot.tokens.extend(new)
        if v.eos:
            item.finish = "eos"
        self._check_done(item)

    def _check_done(self, item: _Live) -> None:
        if item.finish is None and item.output[-1] in self.target.eos_ids:
            item.finish = "eos"
        elif item.finish is None and len(item.output) >= self.config.max_new_tokens:
            item.finish = "length"

    # ---- retirement -----------------------------------------------------------------------------------------
    def _retire(self, ctx, batch, live, on_result) -> KVBatch | None:
        done = [r for r, item in enumerate(live) if item.finish is not None]
        if not done:
            return batch
        leaving = [live[r] for r in done]
        try:
            self.drafter.end(ctx, [i.slot for i in leaving])
        finally:
            live[:] = [item for item in live if item.finish is None]
            if live:
                self.target.drop(batch, done)
            ctx.slots = [i.slot for i in live]
            for item in leaving:
                on_result(_result(item))
        return batch if live else None

    def _clock(self) -> float:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        return time.perf_counter()


def _result(item: _Live) -> RequestResult:
    status = "error" if item.finish == "error" else "ok"
    return RequestResult(
        item.request, status, tuple(item.output), tuple(item.rounds), item.ttft_s, item.decode_s,
        item.finish or "length", item.error,
    )


def _failed(req: Request, exc: BaseException) -> RequestResult:
    return RequestResult(req, "error", (), (), 0.0, 0.0, "error", f"{type(exc).__name__}: {exc}")

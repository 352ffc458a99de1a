"""The drafter protocol: what every method (DSpark, DFlash, Eagle3, MTP, n-gram, vanilla) implements.

A drafter sees the active requests through a shared :class:`DraftContext` and is called by the engine at
four points of a request's life:

1. ``begin(ctx, slots)``: the slots were just prefilled; ``slot.new_features`` holds the target features of
   every prompt position and ``slot.tokens[-1]`` is the first sampled token (no target KV yet).
2. ``propose(ctx) -> Proposal``: draft a block for every slot in ``ctx.slots`` (batch order).
3. ``commit(ctx, slots, verdicts)``: ``slot.tokens`` already holds the committed tokens; ``slot.new_features``
   holds the target features of the positions committed this round (the old current token and the accepted
   drafts); ``slot.tokens[-1]`` is the new current token.
4. ``end(ctx, slots)``: the slots finished (or failed) and leave the batch.

Per-request drafter state lives in ``slot.state``. New needs go into :class:`Slot` / :class:`DraftContext`,
never into extra parameters. Each drafter is built from its own config dataclass only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from dspark_bench.core import rng
from dspark_bench.core.timing import Timer
from dspark_bench.core.verify import Sampling, sample

if TYPE_CHECKING:
    from dspark_bench.core.verify import Verdict
    from dspark_bench.target.model import Features, Target


@dataclass(eq=False)
class Slot:
    """One active request as drafters see it. The engine owns it; drafters read it and keep ``state``."""

    request_id: int
    tokens: list[int]  # prompt + committed output; tokens[-1] is the current token (its target KV is not cached)
    prompt_len: int
    seed: int  # keys every draw of the request: (seed, position, purpose), see dspark_bench.core.rng
    new_features: Features | None = None  # see the module docstring
    state: Any = None  # drafter-owned

    @property
    def position(self) -> int:
        """Absolute position of the current token."""
        return len(self.tokens) - 1


@dataclass(frozen=True)
class RoundTiming:
    """What the engine measured of its last round, for a scheduler that prices rounds (``DraftContext.last_round``).
    ``index`` counts the session's rounds from 1, so each round is learnt once."""

    index: int
    rows: int
    tokens: tuple[int, ...]  # tokens each row verified: 1 + its draft tokens
    context: float  # the rows' mean position when the round began
    drafted: bool  # the drafter ran (the scheduler's plan let it)
    draft_s: float  # plan and propose
    verify_s: float  # the target's forward
    other_s: float  # scheduling, acceptance and bookkeeping


@dataclass(eq=False)
class DraftContext:
    """Run-wide facts plus the active slots in batch order. ``sampling``: how every law is made from logits
    (temperature and filters); a drafter draws with it (``DraftHead.draw(logits, ctx.sampling, ...)``) so that
    its q is the processed law, as the target's p is. A bare temperature is read as ``Sampling(temperature)``."""

    target: Target
    sampling: Sampling
    block_size: int  # the most draft tokens one round may propose (gamma)
    slots: list[Slot] = field(default_factory=list)
    timer: Timer = field(default_factory=Timer)  # spans "forward", "head", "sample" (see dspark_bench.core.timing)
    drafter: str = ""  # the drafter's registry name (a scheduler looks up its cost in the profile by it)
    last_round: RoundTiming | None = None  # set by the engine after each round
    reports_rounds: bool = False  # the engine will set last_round (a scheduler may wait for the first one)
    scratch: dict | None = None  # lent by the engine for its session: memory a drafter may reuse every round

    def __post_init__(self):
        self.sampling = Sampling.of(self.sampling)

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    def draft_uniforms(self, n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Uniforms [R, n] (float64) for draft tokens 1..n of every slot: key (seed, position + j, DRAFT)."""
        from dspark_bench.target.model import to_device

        start = np.array([s.position for s in self.slots], dtype=np.int64)
        u = rng.uniforms([s.seed for s in self.slots], start[:, None] + np.arange(1, n + 1), rng.DRAFT)
        return to_device(u, device or self.target.device)

    def sample(self, probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The one batched sampler: tokens [...] from probs [..., V] with uniforms u [...], timed as "sample"."""
        with self.timer.span("sample"):
            return sample(probs, u)


@dataclass(frozen=True)
class Proposal:
    """Draft blocks for R requests.

    tokens: [R, k] draft tokens; entries at or beyond ``lengths[r]`` are padding.
    lengths: [R] number of real draft tokens per request (0..k).
    q: [R, k, V] float32, the exact distribution each token was sampled from; None = deterministic drafts.
    confidence: [R, k] predicted conditional survival c_k (token k survives given 1..k-1 did), or None.
    Tensors may live on the drafter's device (``tokens`` too); ``lengths`` is on the host.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    q: torch.Tensor | None = None
    confidence: torch.Tensor | None = None

    @staticmethod
    def empty(rows: int) -> Proposal:
        return Proposal(torch.zeros(rows, 0, dtype=torch.long), torch.zeros(rows, dtype=torch.long))


class Drafter(ABC):
    """Base class. Subclasses define ``name``, a nested frozen ``Config`` dataclass and ``propose``."""

    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, config: Any, target: Target):
        self.config = config
        self.target = target

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Decoder layers whose outputs this drafter needs in ``slot.new_features`` (empty: none)."""
        return ()

    def begin(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:  # noqa: B027 - optional hook
        """Requests joined the batch (prefilled)."""

    @abstractmethod
    def propose(self, ctx: DraftContext) -> Proposal:
        """Draft a block for each slot of ``ctx.slots``."""

    def commit(self, ctx: DraftContext, slots: Sequence[Slot], verdicts: Sequence[Verdict]) -> None:  # noqa: B027
        """Tokens were committed for ``slots`` (same order as the proposal)."""

    def end(self, ctx: DraftContext, slots: Sequence[Slot]) -> None:  # noqa: B027
        """Requests left the batch."""

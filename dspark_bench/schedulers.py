"""Schedulers: how many of each request's draft tokens are sent to the target this round.

A scheduler sees the proposal (and, through the context, the active requests) and returns verify lengths
``l_r`` with ``0 <= l_r <= proposal.lengths[r]``. Lossless schedulers are *non-anticipating*: whether draft
token k is verified may depend only on what was known before x_k was sampled (c_1..c_k depend on
x_0..x_{k-1}). The engine further caps each length by the request's remaining token budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from dspark_bench.drafters.base import DraftContext, Proposal

_SCHEDULERS: dict[str, type[Scheduler]] = {}  # filled by @register_scheduler at import time only


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


def create_scheduler(name: str, **options) -> Scheduler:
    if name not in _SCHEDULERS:
        raise SchedulerError(f"unknown scheduler {name!r}; known schedulers: {', '.join(scheduler_names())}")
    return _SCHEDULERS[name](**options)


class Scheduler(ABC):
    name: ClassVar[str]

    @abstractmethod
    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        """Verify lengths, ``[R]`` long, each within ``0..proposal.lengths[r]``."""


@register_scheduler("fixed")
@dataclass(frozen=True)
class Fixed(Scheduler):
    """Verify every proposed token (the paper's offline protocol)."""

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        return proposal.lengths.clone()


def threshold_lengths(confidence: torch.Tensor, lengths: torch.Tensor, theta: float) -> torch.Tensor:
    """Leading run of positions with ``c_k >= theta`` (reference rule); theta <= 0 keeps everything.

    confidence: [R, k] conditional confidences; lengths: [R] proposed lengths.
    """
    if theta <= 0 or confidence.shape[1] == 0:
        return lengths.clone()
    run = torch.cumprod((confidence >= theta).long(), dim=1).sum(1)
    return torch.minimum(run, lengths)


@register_scheduler("threshold")
@dataclass(frozen=True)
class Threshold(Scheduler):
    """Verify the leading draft tokens whose own confidence c_k is at least ``theta``."""

    theta: float = 0.5

    def decide(self, proposal: Proposal, ctx: DraftContext) -> torch.Tensor:
        if proposal.confidence is None:
            return proposal.lengths.clone()  # no confidences: nothing to prune on, behaves as fixed
        return threshold_lengths(proposal.confidence.float().cpu(), proposal.lengths, self.theta)

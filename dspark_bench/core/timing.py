"""Round clocks: marks and named spans on the target device's timeline, resolved once per round.

On CUDA a mark is a recorded ``torch.cuda.Event``, so timing a span inside a drafter costs no host sync; the
round resolves its spans after its single synchronisation. On CPU a mark is ``time.perf_counter()``.

Span names used by the engine and the drafters (summed per round):

* ``forward``: a drafter's model forward passes (its backbone, context ingestion, chain steps, commit-time cache
  extension), the Markov head excluded;
* ``head``: DSpark's Markov head (its own compute, not the sampling that follows it);
* ``sample``: drawing tokens from distributions (drafter and target alike, through ``verify.sample``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

SPANS = ("forward", "head", "sample")


class Timer:
    """Marks and spans on one device's clock (mutable per round; owned by the engine, lent to drafters)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.spans: list[tuple[str, object, object]] = []

    def mark(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        if name not in SPANS:
            raise ValueError(f"unknown span {name!r}; accepted: {', '.join(SPANS)}")
        start = self.mark()
        try:
            yield
        finally:
            self.spans.append((name, start, self.mark()))

    def seconds(self, start: object, end: object) -> float:
        """Seconds between two marks (waits for ``end`` on CUDA)."""
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return float(end) - float(start)

    def totals(self) -> dict[str, float]:
        """Seconds per span name since the last :meth:`clear` (every name of ``SPANS`` present)."""
        out = dict.fromkeys(SPANS, 0.0)
        for name, start, end in self.spans:
            out[name] += self.seconds(start, end)
        return out

    def clear(self) -> None:
        self.spans.clear()

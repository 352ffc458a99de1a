"""Round clocks: marks and named spans on the target device's timeline, resolved once per round; and
:class:`StepClock`, the clock an engine session keeps under open-loop load (arrivals, queueing, deliveries).

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
from collections.abc import Callable, Iterator
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


class StepClock:
    """One engine session's clock under open-loop load, in seconds from its first step: it runs only while the
    session steps (:meth:`running`), and an idle session's wait for its next arrival (:meth:`wait_until`) moves it
    forward without waiting on the wall clock.

    Why not the wall clock: the runner interleaves several engines (drafters) round by round in one process, and
    each must see the arrival schedule as if it were alone on the machine. A clock that runs only during the
    session's own steps gives each engine exactly that timeline (its rounds back to back, its idle gaps) while
    keeping the side-by-side interleaving that exposes every engine to the same machine drift; a wall-clock sleep
    would stall the other engines, and a shared wall clock would charge each engine the others' rounds. On CUDA
    the end of a step waits for the device, so the kernels a step queued are charged to that step.
    ``source``: the time source (``time.perf_counter``; tests pass a fake one)."""

    def __init__(self, device: torch.device | str = "cpu", source: Callable[[], float] = time.perf_counter):
        self.device = torch.device(device)
        self.source = source
        self._elapsed = 0.0
        self._since: float | None = None  # the source's time when the running step began

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count the time of the block (one session step)."""
        self._since = self.source()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self._elapsed += self.source() - self._since
            self._since = None

    def now(self) -> float:
        return self._elapsed + (self.source() - self._since if self._since is not None else 0.0)

    def wait_until(self, t: float) -> None:
        """Idle until ``t`` (no-op when it has passed): the session has nothing to do before then."""
        self._elapsed += max(0.0, t - self.now())

"""When requests arrive: a seeded arrival schedule for open-loop load. Pure: no clock, no I/O.

An open-loop benchmark sends request i at time ``t_i`` whatever the engine is doing, so a slow engine builds a
queue instead of slowing the load (closed-loop load, ``--concurrency R``, keeps R requests in flight and so lets
the engine pace its own load). The gaps between arrivals are independent Gamma(shape = ``burstiness``,
scale = 1 / (``rate`` x ``burstiness``)) draws: mean gap 1 / ``rate`` whatever the shape; shape 1 is a Poisson
process, a shape below 1 burstier arrivals and above 1 more regular ones (``vllm bench serve``'s ``--burstiness``).
The first request arrives at t = 0. A rate of ``inf`` sends every request at t = 0.

The schedule is a function of (rate, burstiness, seed, n): the same seed gives every method the same arrivals,
so methods compared on one schedule see the same load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Arrivals:
    """rate: requests per second (``math.inf``: all at once); burstiness: the gamma shape (1 = Poisson);
    seed: the schedule's seed."""

    rate: float
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (self.rate > 0):  # also refuses NaN
            raise ValueError(f"request rate must be > 0 requests/s (or inf), got {self.rate}")
        if not (0 < self.burstiness < math.inf):
            raise ValueError(f"burstiness (the gamma shape of the gaps) must be a positive number, got "
                             f"{self.burstiness}")

    def times(self, n: int) -> tuple[float, ...]:
        """Arrival times in seconds of ``n`` requests, non-decreasing, the first at 0."""
        if n < 0:
            raise ValueError(f"need n >= 0 requests, got {n}")
        if n == 0:
            return ()
        if math.isinf(self.rate):
            return (0.0,) * n
        gen = np.random.default_rng(self.seed)
        gaps = gen.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness), size=n - 1)
        return (0.0, *np.cumsum(gaps).tolist())

    def to_json(self) -> dict:
        """What a manifest records (``inf`` as the string "inf": JSON has no infinity)."""
        return {"rate": "inf" if math.isinf(self.rate) else self.rate, "burstiness": self.burstiness,
                "seed": self.seed, "process": "poisson" if self.burstiness == 1 else "gamma"}


def parse_rate(text: str) -> float:
    """``--request-rate``: a positive number of requests per second, or ``inf``."""
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"--request-rate {text!r} is not a number; give requests per second (e.g. 0.5) or "
                         f"'inf' (every request at once)") from None
    if not rate > 0:
        raise ValueError(f"--request-rate must be > 0 requests/s or 'inf', got {text!r}")
    return rate

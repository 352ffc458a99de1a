"""Open-loop arrival schedules: seeded, the right mean rate, burstiness as the gamma shape, bad values refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_bench.core.arrivals import Arrivals, parse_rate


def test_infinite_rate_sends_everything_at_once():
    assert Arrivals(math.inf).times(4) == (0.0, 0.0, 0.0, 0.0)
    assert Arrivals(2.0).times(0) == ()


def test_a_schedule_is_a_function_of_its_seed():
    a, b, c = Arrivals(3.0, seed=7).times(50), Arrivals(3.0, seed=7).times(50), Arrivals(3.0, seed=8).times(50)
    assert a == b and a != c
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_mean_gap_is_one_over_the_rate_and_the_shape_sets_the_spread(shape):
    gaps = np.diff(Arrivals(2.0, burstiness=shape, seed=1).times(40_001))
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    # gamma gaps: coefficient of variation 1 / sqrt(shape) (1 for Poisson arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.05)


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0), (1.0, math.inf)])
def test_bad_rates_and_shapes_are_refused(rate, burstiness):
    with pytest.raises(ValueError):
        Arrivals(rate, burstiness)


def test_parse_rate_and_manifest_form():
    assert parse_rate("inf") == math.inf and parse_rate("0.5") == 0.5
    for bad in ("fast", "0", "-2"):
        with pytest.raises(ValueError, match="--request-rate"):
            parse_rate(bad)
    assert Arrivals(math.inf).to_json()["rate"] == "inf"
    assert Arrivals(1.5, 0.5, 3).to_json() == {"rate": 1.5, "burstiness": 0.5, "seed": 3, "process": "gamma"}

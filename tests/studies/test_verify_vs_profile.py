"""dspark_bench.studies.verify_vs_profile and ``dspark-bench study verify-vs-profile``: a profile's verify price against
the verify seconds a sweep's fixed-width cells recorded in their full rounds."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from dspark_bench.cli.study import verify_vs_profile
from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.runs import SCHEMA_VERSION, RunWriter
from dspark_bench.scheduling.profile import load_profile
from dspark_bench.studies.verify_vs_profile import cell_width, priced_cells

PROFILE = FIXTURES / "studies" / "sweep-r32" / "profile.json"  # a measured profile (fixtures/README.md)
PROMPT = 100
# verify seconds each cell recorded, as a multiple of the profile's price
FACTOR = {"none__fixed": 1.25, "dspark__fixed": 0.8, "dspark__fixed@length=2": 1.5,
          "dspark__hardware-aware@layout=padded": 3.0}


def test_cell_width_follows_the_cells_scheduler():
    assert [cell_width(n, 7) for n in ("none__fixed__c8", "dspark__fixed__c8", "dspark__fixed@length=2__c8",
                                       "dspark__hardware-aware@layout=padded__c8")] == [1, 8, 3, None]


def _sweep(root):
    """Cells at R = 1, 2, 4 whose full rounds (R requests in flight, context PROMPT) recorded FACTOR x the price;
    each request's second round, with fewer requests in flight, took 100 s (not a full round: not priced)."""
    profile = load_profile(PROFILE)
    for r in (1, 2, 4):
        for cell, factor in FACTOR.items():
            width = cell_width(f"{cell}__c{r}", 7) or 8
            verify = factor * float(profile.verify_seconds(r, width, PROMPT))
            rounds, timings, batch = [(7, 7, 2, 3)], [(0.0, verify, 0.0, 0.0)], [r]
            if r > 1:
                rounds, timings, batch = [*rounds, (7, 7, 0, 1)], [*timings, (0.0, 100.0, 0.0, 0.0)], [r, r - 1]
            manifest = {"schema_version": SCHEMA_VERSION, "args": {"block_size": 7}}
            with RunWriter(root / "cells" / f"{cell}__c{r}" / "run", manifest) as w:
                for i in range(r):
                    w.add(RequestRecord(cell.split("__")[0], "fixed", "ds", "math", f"p{i}", i, 0, 1, r, "ok",
                                        "length", PROMPT, (1,) * (1 + sum(x[3] for x in rounds)), tuple(rounds),
                                        tuple(timings), 0.1, 1.0, batch=tuple(batch), waiting=(0,) * len(batch)))
    return root


def test_each_fixed_width_cell_is_priced_at_its_full_rounds(tmp_path):
    sweep = _sweep(tmp_path)
    rows = priced_cells(PROFILE, sweep)
    assert len(rows) == 9 and not any("hardware-aware" in r["cell"] for r in rows)  # 3 fixed-width cells x 3 R
    for row in rows:
        cell = row["cell"].rsplit("__", 1)[0]
        assert row["ratio"] == pytest.approx(FACTOR[cell])
        assert row["rounds"] == row["concurrency"] and row["context"] == PROMPT
        assert row["width"] == cell_width(row["cell"], 7)
    done = CliRunner().invoke(verify_vs_profile, [str(PROFILE), str(sweep)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("| cell | R | width |") and len(lines) == 2 + 9
    assert lines[2].startswith("| dspark__fixed@length=2__c1 | 1 | 3 | 1 | 100 |") and lines[2].endswith("| 1.50 |")

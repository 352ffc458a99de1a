"""dspark_bench.studies.sched_bar and ``dspark-bench study sched-bar``: each scheduler's system tokens/s over the best of
`none` and the fixed lengths, per concurrency, from a sweep's rows or within each repeat from its cells' records."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from dspark_bench.cli.study import sched_bar
from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.runs import SCHEMA_VERSION, RunWriter
from dspark_bench.studies.sched_bar import bar_rows, repeat_ratios

HA = "hardware-aware[layout=padded]"


def test_bar_rows_read_the_bar_off_a_sweep():
    """The rows of an equal-rows sweep of 2026-12-03 (a cut of its sweep.json): hardware-aware over the best of none
    and the fixed lengths, 1.004 at R = 1 and 0.602 at R = 32, where not speculating is best."""
    folder = FIXTURES / "studies" / "sweep-equal-rows"
    rows = bar_rows(json.loads((folder / "sweep.json").read_text()), "dspark")
    assert [r["concurrency"] for r in rows] == [1, 2, 4, 8, 16, 32]
    ratio = [r["ratio"][HA] for r in rows]
    assert ratio[0] == pytest.approx(1.004, abs=5e-4) and ratio[-1] == pytest.approx(0.602, abs=5e-4)
    assert rows[-1]["best"] == rows[-1]["tps"]["none"]  # at R = 32 not speculating is best
    for r in rows:
        assert r["best"] == max(v for k, v in r["tps"].items() if k == "none" or k.startswith("fixed"))
        assert r["ratio"] == {k: v / r["best"] for k, v in r["tps"].items() if k.startswith("hardware-aware")}
        assert set(r["budget"]) == set(r["tps"]) - {"none"}
    done = CliRunner().invoke(sched_bar, [str(folder)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("| R | `fixed` |") and "`none`" in lines[0] and f"`{HA}` / best |" in lines[0]
    assert len(lines) == 2 + 6 and lines[-1].startswith("| 32 |")
    assert f"{ratio[-1]:.3f} |" in lines[-1]


# tokens/s of each cell in repeats 0 and 1: hardware-aware spends repeat 0 learning
CELLS = {("none", "fixed"): (10.0, 10.0), ("dspark", "fixed"): (12.0, 8.0), ("dspark", "fixed[length=1]"): (11.0, 9.0),
         ("dspark", HA): (6.0, 11.5), ("ngram", "fixed"): (50.0, 50.0)}


def _sweep(root, levels=(1, 2)):
    rows = []
    for r in levels:
        for (drafter, label), speeds in CELLS.items():
            folder = f"cells/{drafter}__{label}__c{r}"
            rows.append({"concurrency": r, "drafter": drafter, "label": label, "folder": folder})
            with RunWriter(root / folder / "run", {"schema_version": SCHEMA_VERSION, "args": {"block_size": 7}}) as w:
                for repeat, tps in enumerate(speeds):
                    for i in range(r):  # one round per request, R requests in the batch: 20 tokens in 20 / tps s
                        w.add(RequestRecord(drafter, label, "ds", "math", f"p{i}", i, repeat, 1, r, "ok", "length", 4,
                                            (1,) * 21, ((7, 7, 6, 20),), ((0.0, 20 / tps, 0.0, 0.0),), 0.1,
                                            1.0, batch=(r,), waiting=(0,)))
                    if label == HA:  # a failed request: not counted, or the ratio would be far above 2
                        w.add(RequestRecord(drafter, label, "ds", "math", "bad", 99, repeat, 1, r, "error", "error",
                                            4, (1,) * 999, ((7, 7, 7, 998),), ((0.0, 0.1, 0.0, 0.0),), 0.1, 1.0,
                                            batch=(1,), waiting=(0,), error="boom"))
    (root / "sweep.json").write_text(json.dumps({"rows": rows}))
    return root


def test_repeat_ratios_divide_within_each_repeat_of_the_cells_records(tmp_path):
    """Per (R, repeat): the non-fixed cell's system tokens/s over the best of none and the fixed lengths in the
    same repeat, from the ok records of the drafter's and none's cells (another drafter's cells are not read)."""
    folder = _sweep(tmp_path)
    ratios = repeat_ratios(folder, "dspark")
    assert sorted(ratios) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in (1, 2):
        assert ratios[(r, 0)] == {HA: pytest.approx(6.0 / 12.0)}  # the fixed cell was best in repeat 0
        assert ratios[(r, 1)] == {HA: pytest.approx(11.5 / 10.0)}  # none in repeat 1
    done = CliRunner().invoke(sched_bar, [str(folder), "--per-repeat"])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[2:] == ["| 1 | 0 | 0.500 |", "| 1 | 1 | 1.150 |", "| 2 | 0 | 0.500 |",
                                            "| 2 | 1 | 1.150 |"]

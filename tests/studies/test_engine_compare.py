"""Cross-engine comparison table and the vLLM lossless check's power statements (pure; no vLLM needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from dspark_bench.lossless.report import TestResult
from dspark_bench.lossless.vllm import homogeneity_detectable, ks_detectable, with_power
from dspark_bench.studies.compare import comparison_rows, lossless_verdicts, write_comparison


def _summary(drafter: str, tau: float, cond: list[float]) -> dict:
    group = {"scope": "all", "drafter": drafter, "n_requests": 4, "tau": tau, "acceptance_rate": 0.5,
             "positions": {"conditional": cond}, "tokens_per_s": 10.0}
    return {"gamma": len(cond), "groups": [group, {**group, "scope": "domain", "tau": 99.0}]}


def test_rows_put_both_engines_side_by_side_with_their_verdicts(tmp_path):
    lossless = {"rows": [{"test": "pit-ks", "configuration": "vllm smollm2-135m | ngram", "verdict": "fail",
                          "is_control": False},
                         {"test": "pit-ks", "configuration": "vllm smollm2-135m | none", "verdict": "pass",
                          "is_control": False}]}
    for engine, tau in (("dspark", 1.5), ("vllm", 1.4)):
        (tmp_path / engine).mkdir()
        (tmp_path / engine / "summary.json").write_text(json.dumps(_summary("ngram", tau, [0.4, 0.2])))
    (tmp_path / "vllm" / "lossless.json").write_text(json.dumps(lossless))
    rows = write_comparison(tmp_path, ["ngram", "eagle3"], "t")
    assert [(r["engine"], r["tau"], r["lossless"]) for r in rows] == [("dspark", 1.5, "not run"),
                                                                      ("vllm", 1.4, "pit-ks FAIL")]
    md = (tmp_path / "compare.md").read_text()
    assert "| ngram | vllm | 4 | 1.400 | 0.500 | 0.400 | 0.200 | 10.0 | pit-ks FAIL |" in md
    assert lossless_verdicts(lossless, "none") == "pit-ks pass"
    assert comparison_rows({"vllm": _summary("none", 1.0, [])}, {}, ["ngram"]) == []


def test_ks_power_statement_is_the_detectable_distance():
    n, level = 400, 1e-3 / 4
    d = ks_detectable(n, level)
    # the law with CDF u^a is at sup-distance max(u - u^a) from uniform: take the first a where that reaches d
    u = np.linspace(0, 1, 2001)
    a = next(a for a in np.linspace(1.0, 3.0, 2001) if (u - u**a).max() >= d)
    rng = np.random.default_rng(0)
    rejected = [stats.kstest(rng.random(n) ** (1 / a), "uniform").pvalue <= level for _ in range(300)]
    assert np.mean(rejected) >= 0.97


def test_power_notes_are_added_to_the_sampled_rows():
    rows = (TestResult("pit-ks", "vllm x | none", 128, 0.05, 0.3, verdict="pass"),
            TestResult("chi2-homogeneity", "vllm x | ngram", 128, 3.0, 0.5, df=4, verdict="pass", detail="df=4"))
    out = with_power(rows)
    assert "detects sup|F-U| >=" in out[0].detail
    assert out[1].detail.startswith("df=4; detects w2 >= ")
    w2 = homogeneity_detectable(128, 4, 1e-3 / 2)
    power = stats.ncx2.sf(stats.chi2.isf(1e-3 / 2, 4), 4, 128 * w2 / 2)
    assert power == pytest.approx(0.99, abs=1e-3)

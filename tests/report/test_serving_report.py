"""Serving in reports: an open-loop run's serving block as a table per drafter, and a request-rate sweep's
figures and comparisons, numbers as recorded."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_target

from dspark_bench.core.records import RequestRecord
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.report import build_report
from dspark_bench.report.inputs import read_artifact
from dspark_bench.report.style import figure_notes
from dspark_bench.studies.sweep import serving_block, serving_row

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_open_loop_run_gets_a_serving_table_per_drafter(tmp_path, monkeypatch):
    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:14])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i}") for i in range(3)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=8, warmup=False, request_rate=5.0,
                   slo={"tpot": 10_000.0})
    summary = Run(spec, target, prompts, tmp_path / "run").execute()
    res = build_report([tmp_path / "run"], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    assert "serving" in res.sections and "serving_sweep" in {m.key for m in res.missing}
    for name in ("none", "ngram"):
        block = summary["serving"][name]
        row = f"| run | {name} | 5 | 3 | 0 | {block['request_throughput']:.3g} | {block['output_throughput']:.1f} |"
        assert row in md
    assert "within tpot 10000 ms" in md


def _records(rate, tpot_s, n=4, tokens=11):
    return [RequestRecord(
        drafter="x", scheduler="fixed", dataset="d", domain="math", prompt_id=f"p{i}", index=i, repeat=0, seed=i,
        concurrency=0, status="ok", finish="length", prompt_len=4, output_ids=tuple(range(tokens)), rounds=(),
        timings=(), ttft_s=0.1, decode_s=0.0, arrival_s=i / rate, queue_s=0.0, itl_s=(tpot_s,) * (tokens - 1),
        e2el_s=0.1 + (tokens - 1) * tpot_s) for i in range(n)]


def write_rate_sweep(folder):
    """A sweep.json as `sweep --request-rate` writes it, from synthetic records (none slows down twice as fast)."""
    rows = []
    for rate in (1.0, 2.0, 4.0):
        for drafter, label, tpot in (("none", "fixed", 0.05 * rate), ("dspark", "hardware-aware", 0.02 * rate)):
            rows.append({"drafter": drafter, "scheduler": label, "label": label, "concurrency": 0, "options": {},
                         "aggregate_tokens_per_s": 10.0, "per_request_tps": 5.0, "mean_verify_budget": 1.0,
                         "n_requests": 4, "n_errors": 0, "request_rate": rate, "folder": "cells/x",
                         **serving_row(_records(rate, tpot), {"tpot": 120.0})})
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"spec": {}, "profile": None, "rows": rows, "comparisons": [], "serving": serving_block(rows, {"tpot": 120.0})}
    (folder / "sweep.json").write_text(json.dumps(doc))
    return folder / "sweep.json"


def test_a_rate_sweep_draws_the_serving_views_and_the_comparison(tmp_path):
    path = write_rate_sweep(tmp_path / "sweep")
    cells = read_artifact(path)
    assert cells.serving.methods[0].sustained == (4.0, "at_least") and cells.rows[0].request_rate == 1.0
    res = build_report([path], tmp_path / "rep", png=False)
    assert "serving_sweep" in res.sections and "load" in {m.key for m in res.missing}  # no concurrency cells
    md = res.markdown.read_text()
    m = cells.serving.methods[0]
    assert (f"| dspark hardware-aware | none fixed | {len(m.equal_throughput)} | {m.ratio_min:.2f}×–{m.ratio_max:.2f}× "
            f"| ≥ 4 | 2.4 | ≥ {m.rate_ratio:.2f}× |") in md
    assert "p90 TPOT ≤ 120 ms" in md
    html = (tmp_path / "rep" / "index.html").read_text()
    for title in ("Per-user vs system tokens\\u002fs", "p90 TPOT vs system throughput", "Goodput vs offered rate"):
        assert title in html  # the figures' JSON escapes "/"


def test_serving_figures_draw_one_line_per_method(tmp_path):
    from dspark_bench.report.serving import sweep_figures

    cells = read_artifact(write_rate_sweep(tmp_path / "sweep"))
    pareto, latency, goodput = sweep_figures(cells.rows, 120.0)
    assert [t.name for t in pareto.data] == ["none · fixed", "dspark · hardware-aware"]
    none = pareto.data[0]
    assert list(none.y) == pytest.approx([20.0, 10.0, 5.0])  # per-user tok/s = 1 / TPOT at 1, 2 and 4 req/s
    assert list(goodput.data[0].x) == [1.0, 2.0, 4.0] and not figure_notes(latency)

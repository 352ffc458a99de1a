"""Reports that do not overstate: relative gains carry a 95% interval or are withheld below MIN_PROMPTS prompts,
figures without data say why in the figure, one-series charts have a legend, and a resumed run's timings are
flagged where speedups are shown. Runs are made by hand: records.jsonl of synthetic rounds and timings, and the
summary.json that metrics.summarize makes of them (no model)."""

from __future__ import annotations

import json
import random
import re
import statistics
from dataclasses import replace
from pathlib import Path

import plotly.graph_objects as go
import pytest

from dspark_bench.core.records import RequestRecord, record_to_dict
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.report import build_report
from dspark_bench.report.figures import histogram_figure, positions_figure
from dspark_bench.report.gains import MIN_PROMPTS, read_samples, speedup
from dspark_bench.report.load import load_inputs
from dspark_bench.report.style import EMPTY, NOTE, figure_notes, style_figure

GAMMA = 4
DATASETS = {"gsm8k": "math", "humaneval": "code"}
# Per drafter: (mean accepted draft tokens per round, decode seconds per token).
DRAFTERS = {"none": (0.0, 0.040), "dflash": (1.0, 0.030), "dspark": (1.6, 0.025)}


def _record(drafter: str, dataset: str, i: int, rng: random.Random, repeat: int = 0) -> RequestRecord:
    mean, per_token = DRAFTERS[drafter]
    rounds = []
    for _ in range(rng.randint(6, 14)):
        accepted = 0 if drafter == "none" else min(GAMMA, max(0, round(rng.gauss(mean, 1.0))))
        proposed = 0 if drafter == "none" else GAMMA
        rounds.append((proposed, proposed, accepted, accepted + 1))
    tokens = sum(r[3] for r in rounds)
    decode_s = tokens * per_token * rng.uniform(0.8, 1.2)
    return RequestRecord(drafter, "fixed", dataset, DATASETS[dataset], f"{dataset}-{i}", i, repeat, 980406 + i, 1,
                         "ok", "length", 5, tuple(range(tokens + 1)), tuple(rounds),
                         tuple((0.1 * decode_s / len(rounds), 0.9 * decode_s / len(rounds), 0.0, 0.0, 0.0, 0.0)
                               for _ in rounds), 0.05, decode_s)


def write_recorded_run(folder: Path, prompts: int, drafters=("none", "dflash", "dspark"), seed: int = 0,
                       records: list[RequestRecord] | None = None, **manifest_extra) -> Path:
    """A run folder as the engine leaves it: manifest.json, records.jsonl and summary.json (metrics.summarize)."""
    rng = random.Random(seed)
    records = records or [_record(d, ds, i, rng) for d in drafters for ds in DATASETS for i in range(prompts)]
    manifest = {"schema_version": 1, "started": "2026-11-29T10:00:00+0000", "finished": "2026-11-29T10:05:00+0000",
                "args": {"target": "tiny", "drafters": list(drafters), "block_size": GAMMA, "seed": 980406},
                "target": {"name": "tiny", "dtype": "fp32", "device": "cpu"},
                "drafters": {d: {"config": {}} for d in drafters},
                "prompts": [{"dataset": ds, "domain": dom, "prompt_id": f"{ds}-{i}", "index": i}
                            for ds, dom in DATASETS.items() for i in range(prompts)],
                "git": {"sha": "abc1234", "dirty": False}, **manifest_extra}
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "records.jsonl").write_text("".join(json.dumps(record_to_dict(r)) + "\n" for r in records))
    (folder / "summary.json").write_text(json.dumps(summarize(records, GAMMA)))
    return folder


def _row(md: str, start: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def _summary_tau(folder: Path, drafter: str, dataset: str) -> float:
    groups = json.loads((folder / "summary.json").read_text())["groups"]
    return next(g["tau"] for g in groups if (g["drafter"], g["scope"], g["name"]) == (drafter, "dataset", dataset))


INTERVAL = re.compile(r"([-+]\d+\.\d)% \[([-+]\d+\.\d)%, ([-+]\d+\.\d)%\]")
RATIO = re.compile(r"(\d+\.\d\d)× \[(\d+\.\d\d), (\d+\.\d\d)\]")


def test_gains_over_enough_prompts_carry_a_95_interval(tmp_path):
    run = write_recorded_run(tmp_path / "run", prompts=12)
    md = build_report([run], tmp_path / "rep", png=False).markdown.read_text()
    cells = _row(md, "| dspark | dflash |")[2:]  # math, code, macro
    found = [INTERVAL.fullmatch(c) for c in cells]
    assert all(found), cells
    tau = {d: {ds: _summary_tau(run, d, ds) for ds in DATASETS} for d in ("dspark", "dflash")}
    expected = [tau["dspark"]["gsm8k"] / tau["dflash"]["gsm8k"] - 1, tau["dspark"]["humaneval"] /
                tau["dflash"]["humaneval"] - 1,
                statistics.fmean(tau["dspark"].values()) / statistics.fmean(tau["dflash"].values()) - 1]
    for m, want in zip(found, expected, strict=True):
        value, lo, hi = (float(x) for x in m.groups())
        assert value == pytest.approx(100 * want, abs=0.051)  # the value is the summary's, as before
        assert lo < value < hi and hi - lo > 1  # a real interval around it
    assert "95% paired percentile bootstrap" in md and f"fewer than {MIN_PROMPTS} prompts" in md
    speed = _row(md, "| dspark | 24 |")[5]
    m = RATIO.fullmatch(speed)
    assert m and float(m[2]) < float(m[1]) < float(m[3]), speed


def test_gains_below_the_minimum_are_withheld_not_printed(tmp_path):
    run = write_recorded_run(tmp_path / "run", prompts=1)
    res = build_report([run], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    assert _row(md, "| dspark | dflash |")[2:] == ["n = 1 < 10: not shown"] * 3
    assert _row(md, "| dspark | 2 |")[5] == "n = 2 < 10: not shown"  # the speedup over `none`, 2 prompts in all
    assert not re.search(r"\| [-+]\d+\.\d% \|", md)  # no bare percentage anywhere


def test_gains_without_records_are_withheld_even_with_enough_prompts(tmp_path):
    run = write_recorded_run(tmp_path / "run", prompts=12)
    (run / "records.jsonl").unlink()  # a summary alone: the value, but nothing to bound it with
    md = build_report([run], tmp_path / "rep", png=False).markdown.read_text()
    assert _row(md, "| dspark | dflash |")[2:] == ["no per-prompt records: not shown"] * 3
    assert _row(md, "| dspark | 24 |")[5] == "no per-prompt records: not shown"
    assert "No per-prompt records, so no intervals, for run: " in md  # and which run, and why


def _paired_records(factor_tau: int, factor_time: float) -> list[RequestRecord]:
    """dspark commits ``factor_tau`` times what dflash commits in the same rounds of every prompt, and `none` takes
    ``factor_time`` times dspark's seconds per token: the paired ratios are the same on every prompt."""
    rng, out = random.Random(1), []
    for ds in DATASETS:
        for i in range(12):
            base = _record("dflash", ds, i, rng)
            width = 2 * GAMMA  # room for twice dflash's accepted tokens
            rounds = tuple((width, width, c * factor_tau - 1, c * factor_tau) for *_, c in base.rounds)
            tokens = sum(r[3] for r in rounds)
            mine = replace(base, drafter="dspark", rounds=rounds, output_ids=tuple(range(tokens + 1)),
                           decode_s=tokens * 0.01)
            none = replace(mine, drafter="none", rounds=((0, 0, 0, 1),) * tokens, timings=base.timings[:1] * tokens,
                           decode_s=tokens * 0.01 * factor_time)
            out += [base, mine, none]
    return out


def test_the_bootstrap_is_paired_over_prompts(tmp_path):
    """τ per prompt varies a lot, but dspark's is exactly twice dflash's on every prompt and its speed 1.5× that of
    `none`: resampling the same prompts for both sides gives intervals of no width; unpaired ones would be wide."""
    run = write_recorded_run(tmp_path / "run", prompts=12, records=_paired_records(2, 1.5))
    md = build_report([run], tmp_path / "rep", png=False).markdown.read_text()
    assert _row(md, "| dspark | dflash |")[2:] == ["+100.0% [+100.0%, +100.0%]"] * 3
    assert _row(md, "| dspark | 24 |")[5] == "1.50× [1.50, 1.50]"
    inputs = load_inputs([run])
    e = next(e for e in inputs.select("all") if e.drafter == "dspark")
    assert speedup(e, read_samples(inputs.runs)).interval == pytest.approx((1.5, 1.5))


def test_an_empty_figure_says_why_in_the_figure(tmp_path):
    run = write_recorded_run(tmp_path / "run", prompts=1, drafters=("none", "dspark"))
    res = build_report([run], tmp_path / "rep", png=False)
    inputs = load_inputs([run])
    entries = [e for e in inputs.select("domain") if e.drafter == "dspark"]
    fig = positions_figure(inputs, entries)  # one prompt per domain: no position reaches MIN_ROUNDS rounds
    notes = [a for a in fig.layout.annotations if a.name == EMPTY]
    assert len(notes) == 2 and all("No position tested in ≥ 30 rounds" in a.text for a in notes)
    assert {(a.xref, a.yref, a.x, a.y) for a in notes} == {("x domain", "y domain", 0.5, 0.5),
                                                           ("x2 domain", "y2 domain", 0.5, 0.5)}  # each panel
    page, md = res.html.read_text(), res.markdown.read_text()
    assert "No position tested in \\u2265 30 rounds" in page and "No speedup drawn" in page  # in the figure JSON
    assert "_Figure 1: No position tested in ≥ 30 rounds" in md and "_Figure 1: No speedup drawn" in md
    blank = style_figure(go.Figure(go.Scatter(x=[1, 2], y=[None, None])), "t")  # any figure, by default
    assert figure_notes(blank) == ["no recorded values to draw"]
    drawn = style_figure(go.Figure(go.Scatter(x=[1, 2], y=[None, 0.5])), "t")
    assert figure_notes(drawn) == []


def test_a_one_drafter_chart_has_a_legend(tmp_path):
    run = write_recorded_run(tmp_path / "run", prompts=2, drafters=("none", "dspark"))
    inputs = load_inputs([run])
    entries = [e for e in inputs.select("all") if e.drafter == "dspark"]
    fig = histogram_figure(inputs, entries)
    assert len(fig.data) == 1 and fig.data[0].name == "dspark" and fig.data[0].showlegend is not False
    assert fig.layout.showlegend is True  # plotly hides the legend of a one-trace figure unless told
    page = build_report([run], tmp_path / "rep", png=False).html.read_text()
    assert page.count('"showlegend":true') >= 3  # positions, histogram, speed


def test_a_resumed_run_is_flagged_where_speedups_are_shown(tmp_path):
    resumed = [{"started": "2026-11-29T11:00:00+0000", "finished": "2026-11-29T11:02:00+0000", "kept": 30,
                "requests": 18, "git": {"sha": "def5678901234", "dirty": False}, "machine": {}}]
    run = write_recorded_run(tmp_path / "run", prompts=12, resumed=resumed)
    res = build_report([run], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    speed = md.split("## Wall-clock speed")[1].split("## Run manifests")[0]
    assert speed.count("run: timings from 2 processes (resumed 1× (2026-11-29T11:00:00+0000))") == 2  # section, table
    assert "| resumed | 2026-11-29T11:00:00+0000 → 2026-11-29T11:02:00+0000: kept 30 records, decoded 18" in md
    assert "Timings from several processes: run (2)" in res.html.read_text()  # the speed figure's note line
    inputs = load_inputs([run])
    from dspark_bench.report.sections import build_sections

    sections, _ = build_sections(inputs)
    fig = next(s for s in sections if s.key == "speed").figures[0]
    assert figure_notes(fig, NOTE) == ["Timings from several processes: run (2); see the note below the table"]
    plain = write_recorded_run(tmp_path / "plain", prompts=12)
    assert "processes" not in build_report([plain], tmp_path / "rep2", png=False).markdown.read_text()

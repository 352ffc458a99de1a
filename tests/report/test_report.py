"""Reports from hand-made and tiny recorded runs: numbers come from summary.json, missing sections are named,
the paper table shows paper columns only for paper targets, the page is offline, and renders in Chromium."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_bench.cli.report import paper, report
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.report import ReportError, build_report
from dspark_bench.report.export import unavailable_reason
from dspark_bench.report.table1 import load_table1

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "recipes" / "screenshot_report.sh"
CHROMIUM = Path("/usr/bin/chromium")
DOMAINS = {"gsm8k": "math", "aime25": "math", "humaneval": "code", "chat": "chat"}
# Distinctive τ values that no set of records would reproduce by accident: the report must show them verbatim.
TAU = {"eagle3": {"gsm8k": 4.4321, "aime25": 3.2109, "humaneval": 3.8765, "chat": 2.1357},
       "dflash": {"gsm8k": 4.9876, "aime25": 3.6543, "humaneval": 4.1234, "chat": 2.5678},
       "dspark": {"gsm8k": 5.6789, "aime25": 4.5678, "humaneval": 4.9012, "chat": 3.0123}}


def _group(drafter, scope, name, tau, gamma=7, conc=1, scheduler="fixed"):
    cond = None if drafter == "none" else [round(min(0.97, 0.45 + tau / 12 - 0.01 * j), 3) for j in range(gamma)]
    hist = [10] + [0] * gamma if drafter == "none" else [3, 2, 2, 1, 1, 1, 2, 8][: gamma + 1]
    return {"drafter": drafter, "scheduler": scheduler, "concurrency": conc, "scope": scope, "name": name,
            "n_requests": 3, "n_errors": 0, "rounds": 20, "tau": tau, "acceptance_rate": 0.5, "verify_efficiency": 0.5,
            "waste": 0.5, "mean_proposed": gamma, "mean_verified": gamma,
            "positions": {"verified": [20] * gamma, "examined": [20] * gamma, "accepted": [10] * gamma,
                          "marginal_survival": [0.5] * gamma, "survival_reached": [0.5] * gamma, "conditional": cond or
                          [None] * gamma}, "histogram": hist, "tau_ci95": [round(tau - 0.25, 4), round(tau + 0.25, 4)],
            "tokens_per_s_repeats": [12.5], "tokens_per_s": 12.5 * tau, "speedup_vs_none_repeats": [tau / 1.1],
            "speedup_vs_none": 1.0 if drafter == "none" else round(tau / 1.1, 4),
            "ttft_s": {"p50": 0.0123, "p90": 0.0456, "p99": 0.0789}, "tpot_s": {"p50": 0.021, "p90": 0.03, "p99": 0.04},
            "sequential_share": 0.1}


def write_run(folder: Path, target="tiny", gamma=7, tau=None, datasets=tuple(DOMAINS)) -> Path:
    """A hand-made run folder: manifest.json and summary.json (no records)."""
    tau = tau or TAU
    groups = []
    for drafter in ("none", *tau):
        per = {d: (1.0 if drafter == "none" else tau[drafter][d]) for d in datasets}
        groups += [_group(drafter, "dataset", d, v, gamma) for d, v in per.items()]
        for dom in dict.fromkeys(DOMAINS[d] for d in datasets):
            vals = [v for d, v in per.items() if DOMAINS[d] == dom]
            groups.append(_group(drafter, "domain", dom, round(statistics.fmean(vals), 4), gamma))
        groups.append(_group(drafter, "all", "all", round(statistics.fmean(per.values()), 4), gamma))
    manifest = {"schema_version": 1, "started": "2026-11-29T10:00:00+0000", "finished": "2026-11-29T10:05:00+0000",
                "args": {"target": target, "drafters": ["none", *tau], "block_size": gamma, "seed": 980406},
                "target": {"name": target, "dtype": "bf16", "device": "cpu"},
                "drafters": {d: {"config": {}} for d in ("none", *tau)},
                "prompts": [{"dataset": d, "domain": DOMAINS[d], "prompt_id": f"{d}-0", "index": 0} for d in datasets],
                "seeds": {"base": 980406, "per_request": "base + index within dataset"},
                "versions": {"dspark-bench": "0.1.0", "torch": "2.13.0"}, "git": {"sha": "abc1234", "dirty": False},
                "machine": {"platform": "Linux", "cpu_count": 2}}
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "summary.json").write_text(json.dumps({"gamma": gamma, "groups": groups}))
    return folder


def _cell(drafter, label, conc, agg, tps, budget, theta=None, **more):
    options = {} if theta is None else {"theta": theta}
    return {"drafter": drafter, "scheduler": label.split("[")[0], "label": label, "concurrency": conc,
            "options": options, "aggregate_tokens_per_s": agg, "per_request_tps": tps, "mean_verify_budget": budget,
            "waste": 0.3, "tau": 3.5, "acceptance_rate": 0.5, "n_requests": 8, "n_errors": 0, "folder": "cells/x",
            **more}


def write_artifacts(folder: Path) -> Path:
    """One of each optional result file, in the formats their writers use (see report/inputs.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    bins = {s: [[0.1, 0.1 + d, 10], [0.5, 0.5 - d, 20], [0.9, 0.9 - d, 30]] for s, d in (("before", 0.08), ("after", 0.01))}
    thresholds = [_cell("dspark", f"threshold[theta={t}]", 4, 100.0, 30.0, 8 - 5 * t, theta=t, accepted_per_step=5 - t,
                        rejected_per_step=2 - 2 * t, verified_acceptance_rate=0.7 + 0.25 * t) for t in (0.0, 0.3, 0.6, 0.9)]
    load = [_cell(d, lab, c, c * f * 10, 100 * f / c ** 0.3, 2.0 if d == "mtp" else 6 - c / 4)
            for d, lab, f in (("mtp", "fixed[length=1]", 1.0), ("dspark", "hardware-aware", 1.6)) for c in (1, 4, 8)]
    docs = {
        "profile": {"target": "tiny", "dtype": "bf16", "device": "cpu", "machine": "2 vCPU",
                    "context_lengths": [256, 1024], "batch_tokens": [1, 8, 64],
                    "steps_per_s": [[40.0, 38.5, 22.0], [35.0, 33.0, 18.5]]},
        "sweep": {"spec": {"target": "tiny"}, "profile": "profile.json", "rows": thresholds + load, "comparisons": []},
        "simulate": {"simulated": True, "note": "SIMULATED throughput at scale.", "layout": "padded",
                     "rows": [{"simulated": True, "scheduler": "hardware-aware", "concurrency": c, "options": {},
                               "layout": "padded", "aggregate_tokens_per_s": c * 17.0, "per_request_tps": 170 / c ** 0.3,
                               "mean_verify_budget": 6 - c / 5, "waste": 0.2, "tau": 3.9, "n_requests": 32}
                              for c in (1, 4, 8, 16)]},
        "calibration": {"source": {"drafter": "dspark", "prompts": 24},
                        "summary": {"ece_before": 0.06, "ece_after": 0.011, "auroc_before": 0.85, "auroc_after": 0.85,
                                    "brier_before": 0.2, "brier_after": 0.18},
                        "positions": [{"k": k, "n": 100, "temperature": 1.2,
                                       "before": {"ece": 0.057, "auroc": 0.818, "brier": 0.2, "bins": bins["before"]},
                                       "after": {"ece": 0.02, "auroc": 0.818, "brier": 0.18, "bins": bins["after"]}}
                                      for k in (1, 2, 3)]},
        "lossless": {"mode": "quick", "target": "tiny", "dtype": "fp32", "seed": 1, "alpha": 0.001, "seconds": 3.0,
                     "ok": True, "results": [
                         {"test": "chi2 first token", "configuration": "dspark T=1", "n": 20000, "statistic": 12.3,
                          "p_value": 0.4242, "verdict": "pass", "is_control": False, "expected": "pass", "detail": ""},
                         {"test": "chi2 first token", "configuration": "biased sampler", "n": 20000, "statistic": 812.0,
                          "p_value": 1e-12, "verdict": "fail", "is_control": True, "expected": "fail",
                          "power_n": 300, "detail": ""},
                         {"test": "exact law", "configuration": "crashed", "n": 0, "statistic": "nan",
                          "verdict": "fail", "is_control": False, "expected": "pass", "detail": "error: boom"}]},
    }
    for kind, doc in docs.items():
        (folder / f"{kind}.json").write_text(json.dumps(doc))
    return folder


def test_hand_made_run_numbers_come_from_summary(tmp_path):
    res = build_report([write_run(tmp_path / "run")], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    assert "| dspark | 5.68 [5.43, 5.93] | 4.57 [4.32, 4.82] | 5.12 | 4.90 [4.65, 5.15] | 4.90 | 3.01" in md
    macro = statistics.fmean(TAU["dspark"].values())
    assert f"| {macro:.3f} |" in md  # macro average = mean of the four dataset values
    # 3 prompts per dataset: the relative gains are withheld (tests/report/test_gains.py shows them with intervals)
    assert "| dspark | dflash | " + " | ".join(["n = 3 < 10: not shown"] * 4) + " |" in md
    assert "| dspark | 3 | 0 | " in md and "| 12.3 | 45.6 | 78.9 |" in md  # TTFT percentiles in ms
    assert set(res.sections) >= {"table1", "positions", "histogram", "speed", "manifest"}
    missing = {m.key: m.reason for m in res.missing}
    assert set(missing) == {"paper", "block_size", "sweep", "calibration", "profile", "load", "lossless",
                            "serving_sweep", "serving"}
    assert "simulate.json" in missing["load"] and "calibration.json" in missing["calibration"]
    assert "block sizes" in missing["block_size"] and "sweep.json" in missing["sweep"]
    assert "## Not in this report" in md and "lossless.json" in md


def test_html_is_offline_with_plotly_once(tmp_path):
    res = build_report([write_run(tmp_path / "run")], tmp_path / "rep", png=False)
    page = res.html.read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", page)
    assert page.count("* plotly.js v") == 1
    assert page.count("Plotly.newPlot(") == 3  # positions, histogram, speed
    assert "Abc1234".lower() in page and "Not in this report" in page


def test_artifacts_render_when_present(tmp_path):
    run = write_run(tmp_path / "run")
    res = build_report([run, write_artifacts(tmp_path / "extra")], tmp_path / "rep", png=False)
    assert {"sweep", "calibration", "profile", "load", "lossless"} <= set(res.sections)
    md = res.markdown.read_text()
    assert "| chi2 first token | biased sampler | control | 20000 | 812 | 1e-12 | fail | fail | yes |" in md
    assert "| exact law | crashed | method | 0 | – | – | fail | pass | NO | error: boom |" in md
    assert "| (unnamed) | hardware-aware | simulated | 16 | 272.0 |" in md and "| mtp | fixed[length=1] | measured | 8 |" in md
    assert "| dspark | all | 4 | 0.3 | 4.70 | 1.40 | 77.5% |" in md  # Figure 5 rows as recorded
    assert "| 1 | 100 | 1.20 | 5.7% | 2.0% | 0.818 |" in md  # calibration per position, as recorded
    page = res.html.read_text()
    assert "(measured)" in page and "(simulated)" in page and "ECE 6.0%" in page


def test_bad_result_file_says_what_is_wrong(tmp_path):
    folder = write_artifacts(tmp_path / "extra")
    (folder / "profile.json").write_text(json.dumps({"context_lengths": [1], "batch_tokens": [1],
                                                      "steps_per_s": [[1.0]], "surprise": 1}))
    with pytest.raises(ReportError, match="surprise"):
        build_report([folder], tmp_path / "rep", png=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="neither a run folder"):
        build_report([tmp_path / "empty"], tmp_path / "rep2", png=False)


def test_block_size_sweep_from_several_runs(tmp_path):
    runs = [write_run(tmp_path / f"g{g}", gamma=g, tau={"dspark": {d: v + g / 10 for d, v in TAU["dspark"].items()}})
            for g in (3, 7)]
    res = build_report(runs, tmp_path / "rep", png=False)
    assert "block_size" in res.sections
    md = res.markdown.read_text()
    assert "dspark · γ=3" in md and "| drafter | domain | γ=3 | γ=7 |" in md
    math = [statistics.fmean([TAU["dspark"][d] + g / 10 for d in ("gsm8k", "aime25")]) for g in (3, 7)]
    assert f"| dspark | math | {math[0]:.2f} [{math[0] - 0.25:.2f}, {math[0] + 0.25:.2f}] | {math[1]:.2f}" in md


def _with_architecture(folder: Path, drafter: str, **arch) -> Path:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["drafters"][drafter]["architecture"] = {"num_layers": 2, "markov_head_type": "vanilla", **arch}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_block_size_series_are_told_apart_by_recorded_architecture(tmp_path):
    """Two DSpark variants swept over γ: one series per variant (from the manifests' architecture), each joining
    its γ; without the architecture two runs share (label, γ), and each run becomes its own series."""
    runs = [_with_architecture(write_run(tmp_path / f"{head}{g}", gamma=g, tau={"dspark": {
        d: v + g / 10 + (0.05 if head == "rnn" else 0) for d, v in TAU["dspark"].items()}}), "dspark",
        markov_head_type=head) for head in ("vanilla", "rnn") for g in (3, 7)]
    md = build_report(runs, tmp_path / "rep", png=False).markdown.read_text()
    rnn = statistics.fmean([TAU["dspark"][d] + 0.3 + 0.05 for d in ("gsm8k", "aime25")])
    assert re.search(rf"\| dspark · head=rnn \| math \| {rnn:.2f} \[[^]]+\] \| [0-9.]+ ", md), md
    assert '| dspark · head=vanilla | math |' in md
    for folder in runs:  # the same runs without an architecture: no crash, one series per run
        manifest = json.loads((folder / "manifest.json").read_text())
        del manifest["drafters"]["dspark"]["architecture"]
        (folder / "manifest.json").write_text(json.dumps(manifest))
    md = build_report(runs, tmp_path / "rep2", png=False).markdown.read_text()
    assert "| dspark · rnn3 | math |" in md and "| dspark · vanilla7 | math |" in md


def _tiny_run(tmp_path, monkeypatch, target) -> Path:
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} xyz") for i in range(2)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=8, block_size=4, warmup=False)
    Run(spec, target, prompts, tmp_path / "run").execute()
    return tmp_path / "run"


def test_tiny_recorded_run_and_unfinished_copy(tmp_path, monkeypatch, tiny):
    run = _tiny_run(tmp_path, monkeypatch, tiny)
    summary = json.loads((run / "summary.json").read_text())
    ngram = next(g for g in summary["groups"] if g["drafter"] == "ngram" and g["scope"] == "dataset")
    res = build_report([run], tmp_path / "rep", png=False)
    assert f"| ngram | {ngram['tau']:.2f}" in res.markdown.read_text()
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished)
    (unfinished / "summary.json").unlink()
    res2 = build_report([unfinished], tmp_path / "rep2", png=False)
    md = res2.markdown.read_text()
    assert f"| ngram | {ngram['tau']:.2f}" in md and "run unfinished; metrics.summarize" in md


def test_paper_columns_only_for_paper_targets(tmp_path):
    qwen = write_run(tmp_path / "qwen", target="Qwen/Qwen3-4B", tau={"dspark": {"gsm8k": 6.0, "humaneval": 5.5,
                                                                                "chat": 3.0}},
                     datasets=("gsm8k", "humaneval", "chat"))
    res = build_report([qwen], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    assert "Ours vs the paper's Table 1: Qwen3-4B" in md
    assert "| dspark | gsm8k | 6.00 [5.75, 6.25] | 6.11 | -0.11 | -1.8% |" in md
    assert "| dspark | humaneval | 5.50 [5.25, 5.75] | 5.38 | +0.12 | +2.2% |" in md
    assert "| dspark | chat | 3.00 [2.75, 3.25] | – | – | – | not a paper benchmark |" in md
    theirs = statistics.fmean([6.11, 5.38])
    assert f"| dspark | macro (2 datasets) | 5.750 | {theirs:.3f} | {5.75 - theirs:+.3f} |" in md
    other = build_report([write_run(tmp_path / "tiny")], tmp_path / "rep2", png=False)
    assert "paper" not in other.sections and "paper target" in {m.key: m.reason for m in other.missing}["paper"]


def test_paper_table1_json_is_consistent():
    table = load_table1()
    assert [d.name for d in table.datasets] == ["gsm8k", "math500", "aime25", "mbpp", "humaneval", "livecodebench",
                                                "mt-bench", "alpaca", "arena-hard-v2"]
    for t in table.targets:
        for drafter, row in t.tau.items():
            assert t.macro[drafter] == pytest.approx(statistics.fmean(row.values()), abs=6e-4)
    q4 = table.match("Qwen/Qwen3-4B")
    assert q4.macro["dspark"] / q4.macro["eagle3"] - 1 == pytest.approx(0.309, abs=5e-4)
    assert q4.macro["dspark"] / q4.macro["dflash"] - 1 == pytest.approx(0.163, abs=5e-4)
    assert [round(v, 2) for v in q4.domain_means["dspark"].values()] == [5.57, 5.12, 3.49]


@pytest.mark.parametrize("name, expected", [
    ("Qwen/Qwen3-4B", "Qwen3-4B"), ("/models/qwen3-4b/", "Qwen3-4B"), ("Qwen/Qwen3-14B", "Qwen3-14B"),
    ("google/gemma-4-12B-it", "Gemma4-12B"), ("Qwen/Qwen3-4B-Instruct-2507", None), ("smollm2-135m", None),
])
def test_paper_target_matching(name, expected):
    found = load_table1().match(name)
    assert (found.name if found else None) == expected


def test_paper_table1_command_tiny(tmp_path, monkeypatch, tiny):
    from dspark_bench.target.model import Target

    target = tiny
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    monkeypatch.setattr(Target, "load", classmethod(lambda cls, *a, **k: target))
    data = tmp_path / "eval_datasets"
    data.mkdir()
    (data / "gsm8k.jsonl").write_text("".join(json.dumps({"turns": [f"What is {i} + {i}?"]}) + "\n" for i in range(5)))
    args = ["table1", "--drafters", "none,ngram", "--datasets", "gsm8k,mbpp,alpaca", "--data-dir", str(data),
            "--limit", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "run"), "-o", str(tmp_path / "rep"),
            "--no-png"]
    res = CliRunner().invoke(paper, args)
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "run" / "paper_table1.json").read_text())["datasets"]
    assert [(r["name"], r["source"], r["prompts"]) for r in plan] == [
        ("gsm8k", "data-dir", 1), ("mbpp", "missing", 0), ("alpaca", "stand-in", 1)]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Table 1 protocol: tiny-llama-0" in md and "paper τ" not in md
    assert "chat: built-in stand-in for alpaca." in md and "| mbpp | code | missing |" in md
    assert re.search(r"\| ngram \| chat \| [0-9.]+[^|]* \| built-in stand-in for alpaca \|", md)


def test_report_command(tmp_path):
    run = write_run(tmp_path / "run")
    res = CliRunner().invoke(report, [str(run), "-o", str(tmp_path / "rep"), "--no-png"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "index.html").is_file() and "not in this report" in res.output
    bad = CliRunner().invoke(report, [str(tmp_path / "rep"), "-o", str(tmp_path / "rep2")])
    assert bad.exit_code == 2 and "neither a run folder" in bad.output


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}")
def test_png_export(tmp_path):
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "profile.json").write_text(json.dumps({"context_lengths": [256], "batch_tokens": [1, 8],
                                                      "steps_per_s": [[40.0, 38.0]]}))
    res = build_report([folder], tmp_path / "rep")
    assert res.png_note is None and [p.name for p in res.pngs] == ["profile-1.png"]
    assert res.pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](figures/profile-1.png)" in res.markdown.read_text()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: install it with apt-get install -y chromium "
                    "to check the report in a real browser")
def test_report_renders_in_chromium(tmp_path):
    run = write_run(tmp_path / "run")
    res = build_report([run, write_artifacts(tmp_path / "extra")], tmp_path / "rep", png=False)
    out = subprocess.run(["bash", str(SCREENSHOT), str(res.out_dir), str(tmp_path / "shot.png")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "figures rendered: 7/7" in out.stdout and (tmp_path / "shot.png").stat().st_size > 10_000


def test_wilson_interval_matches_the_closed_form():
    from dspark_bench.report.tables import wilson

    lo, hi = wilson(6296, 21392)  # DFlash's first position on math (full-a)
    assert (round(lo, 4), round(hi, 4)) == (0.2882, 0.3005)
    assert wilson(1, 1)[0] < 0.21 and wilson(1, 1)[1] == 1.0  # one round says almost nothing
    assert wilson(0, 0) is None and wilson(0, 10)[0] == 0.0


def test_position_curve_has_intervals_and_marks_thin_positions(tmp_path):
    folder = write_run(tmp_path / "run")
    summary = json.loads((folder / "summary.json").read_text())
    for g in summary["groups"]:
        if g["drafter"] == "dflash":  # the late positions rest on a handful of rounds, the last on one
            g["positions"].update(examined=[400, 120, 30, 12, 4, 2, 1], accepted=[120, 30, 9, 2, 1, 1, 1],
                                  conditional=[0.3, 0.25, 0.3, 2 / 12, 0.25, 0.5, 1.0])
    (folder / "summary.json").write_text(json.dumps(summary))
    res = build_report([folder], tmp_path / "rep", png=False)
    md = res.markdown.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| math | dflash"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    assert cells[0] == "0.30 [0.26, 0.35]" and cells[2] == "0.30 [0.17, 0.48]"
    assert cells[3:] == ["(0.17, n=12)", "(0.25, n=4)", "(0.50, n=2)", "(1.00, n=1)"]
    assert "Wilson interval" in md and "fewer than 30 rounds" in md
    html = res.html.read_text()
    assert '"arrayminus"' in html  # the figure carries the intervals as error bars
    from dspark_bench.report.figures import positions_figure
    from dspark_bench.report.load import load_inputs

    inputs = load_inputs([folder])
    entries = [e for e in inputs.select("domain") if e.drafter == "dflash" and e.name == "math"]
    trace = positions_figure(inputs, entries).data[0]
    assert list(trace.y[:3]) == [0.3, 0.25, 0.3] and all(v is None for v in trace.y[3:])  # thin positions dropped


def test_a_run_recorded_from_a_dirty_tree_says_so(tmp_path):
    clean = write_run(tmp_path / "clean")
    res = build_report([clean], tmp_path / "rep-clean", png=False)
    assert "uncommitted changes" not in res.markdown.read_text()
    assert "abc1234 (clean)" in res.markdown.read_text()
    dirty = write_run(tmp_path / "dirty")
    manifest = json.loads((dirty / "manifest.json").read_text())
    manifest["parts"] = [{"folder": "results/x/a", "git": {"sha": "1111111111aa", "dirty": True}},
                         {"folder": "results/x/b", "git": {"sha": "2222222222bb", "dirty": False}}]
    (dirty / "manifest.json").write_text(json.dumps(manifest))
    res = build_report([clean, dirty], tmp_path / "rep", png=False)
    md, html = res.markdown.read_text(), res.html.read_text()
    head = md.split("## ")[0]
    assert "Warning: recorded from a git working tree with uncommitted changes" in head
    assert "dirty (a at 1111111111)" in head and "clean (" not in head
    assert "merged from: a 1111111111aa (DIRTY: uncommitted changes); b 2222222222bb (clean)" in md
    assert "Warning: recorded from a git working tree with uncommitted changes" in html

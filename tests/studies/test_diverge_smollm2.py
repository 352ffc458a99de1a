"""Divergence forensics on the real embedded target: ``run`` at temperature 0 reports greedy equality with
``none`` in its summary; ``diverge`` replays real runs faithfully, judges the fp32 divergences between
concurrency 1 and 8 floating-point, and calls a token no law drew unexplained.

The bf16 near-tie first seen on an AVX-512-BF16 CPU (HumanEval/104 parting at output token 41 between ``none`` and
``ngram`` at temperature 0, ``--limit 2 --max-new-tokens 48``) does not reproduce on an AMD EPYC without native
bf16 matmuls (both outputs equal, 2026-12-06), where bf16 also runs many times slower. What reproduced there is
fp32 sampling at concurrency 1 against 8: ``none`` on ``--suite all --limit 2`` at seed 0 parted on gsm8k-0902
(token 27) and HumanEval/64 (token 26), each a decode draw whose uniform lay ~5e-8 from a CDF cut while the two
batch shapes' laws differed by ~2-4e-6. Other CPUs round otherwise, so that test judges whatever divergences
appear and skips when none does."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_bench.cli.main import main
from dspark_bench.evaluation import forensics as fx

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]  # the runs above: one thread


def test_greedy_report_and_a_faithful_replay(tmp_path):
    cli = CliRunner()
    run = tmp_path / "t0"
    res = cli.invoke(main, ["run", "--drafter", "none,ngram", "--suite", "code", "--limit", "1", "--max-new-tokens",
                            "16", "--temperature", "0", "--dtype", "fp32", "--seed", "0", "--out", str(run)])
    assert res.exit_code == 0, res.output
    assert "greedy == none: ngram 1/1 requests equal" in res.output
    report = json.loads((run / "summary.json").read_text())["greedy_equality"]
    assert report["ngram"]["requests_equal"] == 1 and report["ngram"]["divergences"] == []
    bad = tmp_path / "bad"  # the ngram record with its 10th token replaced: no rounding draws that
    bad.mkdir()
    (bad / "manifest.json").write_text((run / "manifest.json").read_text())
    lines = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    rec = next(r for r in lines if r["drafter"] == "ngram")
    rec["output_ids"][10] = (rec["output_ids"][10] + 1000) % 49152
    (bad / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "report.json"
    res = cli.invoke(main, ["diverge", str(run), str(bad), "--out", str(out)])
    assert res.exit_code == 1 and "unexplained" in res.output, res.output
    (row,) = json.loads(out.read_text())["divergences"]
    assert row["index"] == 10 and row["verdict"] == fx.UNEXPLAINED and row["decision"]["kind"] == "greedy"
    assert row["replay"][0]["reproduced"] and row["replay"][0]["prefix_equal"] and row["replay"][0]["rows"] == 1
    assert row["margins"][0] > 0 > row["margins"][1] and row["max_abs_logits"] == 0  # one law, replayed twice


def test_fp32_batch_divergences_are_floating_point(tmp_path):
    cli = CliRunner()
    args = ["run", "--drafter", "none", "--suite", "all", "--limit", "2", "--max-new-tokens", "32",
            "--temperature", "1", "--dtype", "fp32", "--seed", "0"]
    for c in (1, 8):
        res = cli.invoke(main, [*args, "--concurrency", str(c), "--out", str(tmp_path / f"c{c}")])
        assert res.exit_code == 0, res.output
    out = tmp_path / "report.json"
    res = cli.invoke(main, ["diverge", str(tmp_path / "c1"), str(tmp_path / "c8"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert res.exit_code == 0 and report["drafters"]["none"]["requests"] == 8, res.output
    rows = report["divergences"]
    if not rows:
        pytest.skip("concurrency 1 and 8 gave the same tokens on this machine: nothing to judge")
    for row in rows:
        assert row["verdict"] == fx.FLOATING and row["decision"]["kind"] == "token", row
        assert [r["reproduced"] for r in row["replay"]] == [True, True]  # the laws are the runs' own
        assert row["replay"][1]["rows"] > 1 and 0 < row["law_difference"] < 1e-4  # a batch; rounding-sized

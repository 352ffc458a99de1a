"""dspark_bench.studies.draft_vocab and ``dspark-bench study draft-vocab-compare``: one drafter's full head against its
reduced draft vocabulary, from two runs of the same prompts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from dspark_bench.cli.study import draft_vocab_compare
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import RunWriter, read_manifest, read_records
from dspark_bench.studies.claims import ClaimsError
from dspark_bench.studies.draft_vocab import compare, text

RUN = FIXTURES / "studies" / "offline-r1"  # a run of none and four drafters (fixtures/README.md)


def test_compare_reads_two_runs(tmp_path):
    """A run against itself: the summary's tau and first-position acceptance, no change, the same drafting cost."""
    gamma = int(read_manifest(RUN)["args"]["block_size"])
    want = next(g for g in summarize(read_records(RUN), gamma)["groups"]
                if g["drafter"] == "dspark" and g["scope"] == "all")
    done = CliRunner().invoke(draft_vocab_compare, [str(RUN), str(RUN), "--drafter", "dspark",
                                                    "--json", str(tmp_path / "c.json")])
    assert done.exit_code == 0, done.output
    out = json.loads((tmp_path / "c.json").read_text())
    assert out["full"]["tau"] == pytest.approx(want["tau"]) and out["delta"]["tau"] == 0
    assert out["full"]["first_position_acceptance"] == pytest.approx(want["positions"]["conditional"][0])
    assert out["delta"]["drafting_cost_ratio"] == pytest.approx(1.0) and out["full"]["draft_s_per_round"] > 0
    assert "prompts" not in out["full"] and out["drafter"] == "dspark"
    assert "| tau |" in done.output and done.output == text(compare(RUN, RUN, "dspark"))
    done = CliRunner().invoke(draft_vocab_compare, [str(RUN), str(RUN), "--drafter", "ngram"])
    assert done.exit_code == 2 and "no records of drafter 'ngram'" in done.output


def test_compare_refuses_runs_of_other_prompts(tmp_path):
    records = read_records(RUN)
    dropped = records[0].prompt_id
    with RunWriter(tmp_path / "fewer", read_manifest(RUN)) as w:
        for r in records:
            if r.prompt_id != dropped:
                w.add(r)
    with pytest.raises(ClaimsError, match="different prompts"):
        compare(RUN, tmp_path / "fewer", "dspark")

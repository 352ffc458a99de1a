"""A report input that is damaged fails with one line naming the file and what is accepted: a run's summary.json
or manifest.json, or a result file such as profile.json, that is not a UTF-8 JSON object."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from test_report import write_run

from dspark_bench.cli.main import main
from dspark_bench.report import ReportError
from dspark_bench.report.inputs import read_artifact
from dspark_bench.report.load import read_run


def _one_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    return lines[0]


def test_a_damaged_summary_names_the_file_and_the_way_out(tmp_path):
    run = write_run(tmp_path / "run")
    summary = run / "summary.json"
    summary.write_text(summary.read_text()[:80])
    with pytest.raises(ReportError, match=r"run/summary.json: not valid JSON \(.*: line 1 column \d+\); expected the "
                                          r"summary.json that dspark-bench run writes \(delete it to summarise the "
                                          r"run from its records.jsonl\)"):
        read_run(run)
    line = _one_line(CliRunner().invoke(main, ["report", str(run), "-o", str(tmp_path / "rep"), "--no-png"]))
    assert line.startswith(f"error: {summary}: not valid JSON")
    assert not (tmp_path / "rep").exists()


def test_a_damaged_manifest_names_the_file(tmp_path):
    run = write_run(tmp_path / "run")
    (run / "manifest.json").write_bytes(b'{"schema_version": 1, "note": "\xe9"}')
    with pytest.raises(ReportError, match=r"run/manifest.json: not UTF-8 text \(byte 0xe9 at offset 31\)"):
        read_run(run)


@pytest.mark.parametrize("text, why", [
    (b'{"target": "x", ', r"not valid JSON \(Expecting property name enclosed in double quotes: line 1 column 17\)"),
    (b"\xff\xfe{}", r"not UTF-8 text \(byte 0xff at offset 0\)"),
    (b"[]", "a JSON list, not an object"),
])
def test_a_damaged_result_file_names_the_file(tmp_path, text, why):
    path = tmp_path / "profile.json"
    path.write_bytes(text)
    with pytest.raises(ReportError, match=f"profile.json: {why}; expected the JSON object of a profile.json"):
        read_artifact(path)

"""Damaged input files fail with one error that names the file (and the line, where there is one) and says what
is accepted: prompt files (not gzip, cut short, not UTF-8), a run's manifest.json, summary.json, records and
lossless.json, and a gate baseline. Nothing is cut from a records file that is damaged rather than torn."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from click.testing import CliRunner
from test_gate import _write_run

from dspark_bench.cli.main import main
from dspark_bench.core.records import ResultsError
from dspark_bench.evaluation.gate import GateError, load_baseline, snapshot
from dspark_bench.evaluation.runs import drop_torn_tail, read_json, read_manifest, read_records
from dspark_bench.evaluation.suites import SuiteError, load_jsonl, load_suite

ROWS = "".join(json.dumps({"turns": [f"prompt {i}"]}) + "\n" for i in range(40)).encode()


def _one_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    return lines[0]


# ---- prompt files ----------------------------------------------------------------------------------------------
def not_gzip(path):
    path.write_bytes(ROWS)


def cut_short(path):
    data = gzip.compress(ROWS)
    path.write_bytes(data[: len(data) // 2])


def corrupt(path):
    data = bytearray(gzip.compress(ROWS))
    data[20] ^= 0xFF  # inside the deflate stream
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, why", [
    (not_gzip, "Not a gzipped file"),
    (cut_short, "Compressed file ended before the end-of-stream marker was reached"),
    (corrupt, "while decompressing data|CRC check failed"),
])
def test_a_damaged_gzip_suite_names_the_file(tmp_path, damage, why):
    path = tmp_path / "prompts.jsonl.gz"
    damage(path)
    for load in (lambda: load_jsonl(path), lambda: load_suite(str(path))):
        with pytest.raises(SuiteError) as err:
            load()
        message = str(err.value)
        assert message.startswith(f"{path}: not a readable gzip file (not gzip, truncated or corrupt: ")
        assert re.search(why, message) and "accepted: a UTF-8 .jsonl file or a gzip-compressed .jsonl.gz" in message


def test_a_byte_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"turns": ["fine"]}\n\n{"turns": ["caf\xe9"]}\n')
    with pytest.raises(SuiteError, match=r"latin1.jsonl, line 3: not UTF-8 text \(byte 0xe9 at position 16\); "
                                         r"prompt files are UTF-8"):
        load_jsonl(path)
    packed = tmp_path / "packed.jsonl"  # a gzip file without its .gz name
    packed.write_bytes(gzip.compress(ROWS))
    with pytest.raises(SuiteError, match=r"packed.jsonl, line 1: not UTF-8 text .*it looks gzip-compressed: name it "
                                         r"\.jsonl\.gz"):
        load_jsonl(packed)


def test_a_good_gzip_suite_and_crlf_lines_still_load(tmp_path):
    path = tmp_path / "ok.jsonl.gz"
    path.write_bytes(gzip.compress(ROWS.replace(b"\n", b"\r\n")))
    assert [p.text for p in load_jsonl(path, limit=40)][:2] == ["prompt 0", "prompt 1"]


def test_cli_run_reports_a_bad_suite_in_one_line_before_the_target_loads(tmp_path, monkeypatch):
    from dspark_bench.target.model import Target

    loaded = []
    monkeypatch.setattr(Target, "load", lambda *a, **k: loaded.append(1))
    path = tmp_path / "bad.jsonl.gz"
    cut_short(path)
    res = CliRunner().invoke(main, ["run", "--suite", str(path), "--drafter", "none", "--limit", "1",
                                    "--max-new-tokens", "4", "--out", str(tmp_path / "run")])
    assert _one_line(res).startswith(f"error: {path}: not a readable gzip file")
    assert not loaded and not (tmp_path / "run").exists()


# ---- run folders -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, why", [
    (b'{"schema_version": 1,', "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 22)"),
    (b"  \n", "not valid JSON (empty file)"),
    (b'{"note": "\xff"}', "not UTF-8 text (byte 0xff at offset 10)"),
    (b"[1]", "a JSON list, not an object"),
])
def test_read_json_names_the_file_and_what_is_accepted(tmp_path, text, why):
    path = tmp_path / "manifest.json"
    path.write_bytes(text)
    with pytest.raises(ResultsError) as err:
        read_manifest(tmp_path)
    assert str(err.value) == f"{path}: {why}; expected the manifest.json that dspark-bench run writes (a JSON object)"
    with pytest.raises(GateError, match="expected a thing"):  # the caller's error class
        read_json(path, "a thing", GateError)


def test_damaged_records_name_the_file_and_line(tmp_path):
    run = _write_run(tmp_path / "run", 1, 3.0, n_prompts=2)
    records = run / "records.jsonl"
    with records.open("ab") as fh:
        fh.write(b'{"drafter": "caf\xe9"}\n')
    with pytest.raises(ResultsError, match=r"records.jsonl:5: not UTF-8 text \(byte 0xe9\)"):
        read_records(run)
    before = records.read_bytes()
    with pytest.raises(ResultsError, match=r"records.jsonl:5: not UTF-8 text"):
        drop_torn_tail(run)  # damage, not a torn write: nothing is cut
    assert records.read_bytes() == before
    packed = records.with_name("records.jsonl.gz")
    packed.write_bytes(gzip.compress(before)[:40])
    records.unlink()
    with pytest.raises(ResultsError, match=r"records.jsonl.gz: not a readable gzip file \(Compressed file ended"):
        read_records(run)


def test_gate_names_a_damaged_summary_lossless_file_and_baseline(tmp_path):
    run = _write_run(tmp_path / "run", 1, 3.0, n_prompts=2)
    (run / "summary.json").write_text('{"groups": [')
    with pytest.raises(ResultsError, match=r"run/summary.json: not valid JSON \(Expecting value: line 1 column 13\); "
                                           r"expected the summary.json that dspark-bench run writes"):
        snapshot([run])
    (run / "summary.json").write_text('{"groups": 3}')
    with pytest.raises(GateError, match=r"run/summary.json: no 'groups' list"):
        snapshot([run])
    (run / "summary.json").unlink()
    (run / "lossless.json").write_bytes(b"\x00\xff")
    with pytest.raises(ResultsError, match=r"run/lossless.json: not UTF-8 text"):
        snapshot([run])
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "baseline.json").write_text("{")
    with pytest.raises(GateError, match=r"base/baseline.json: not valid JSON .*'dspark-bench baseline update'"):
        load_baseline(tmp_path / "base")
    res = CliRunner().invoke(main, ["gate", "--baseline", str(tmp_path / "base"), str(run)])
    assert _one_line(res).startswith(f"error: {tmp_path / 'base' / 'baseline.json'}: not valid JSON")

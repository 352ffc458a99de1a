"""``dspark-bench study check-runs``: every run folder under a root is read whole, and a bad one fails the command."""

from __future__ import annotations

import gzip
import json

from click.testing import CliRunner

from dspark_bench.cli.study import check_runs
from dspark_bench.core.records import RequestRecord, record_to_dict
from dspark_bench.evaluation.runs import check_run_folders


def _record(prompt_id: str) -> dict:
    return record_to_dict(RequestRecord(
        drafter="none", scheduler="fixed", dataset="gsm8k", domain="math", prompt_id=prompt_id, index=0, repeat=0,
        seed=1, concurrency=1, status="ok", finish="length", prompt_len=3, output_ids=(5, 6), rounds=((0, 0, 0, 1),),
        timings=((0.0, 0.01, 0.0, 0.0, 0.0, 0.0),), ttft_s=0.01, decode_s=0.02))


def _write(folder, prompt_ids, packed=False):
    folder.mkdir(parents=True)
    text = "".join(json.dumps(_record(p)) + "\n" for p in prompt_ids)
    if packed:
        (folder / "records.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (folder / "records.jsonl").write_text(text)


def test_good_folders_pass_and_a_duplicated_key_fails(tmp_path):
    _write(tmp_path / "root" / "a", ["p1", "p2"])
    _write(tmp_path / "root" / "deep" / "b", ["p1"], packed=True)
    _write(tmp_path / "root" / "dup", ["p1", "p1"])
    checked = dict(check_run_folders([tmp_path / "root"]))
    assert checked[tmp_path / "root" / "a"] is None and checked[tmp_path / "root" / "deep" / "b"] is None
    assert "already recorded on line 1" in checked[tmp_path / "root" / "dup"]
    done = CliRunner().invoke(check_runs, [str(tmp_path / "root")])
    assert done.exit_code == 1 and "2 of 3 run folders read whole" in done.output


def test_all_good_exits_0_and_an_empty_root_fails(tmp_path):
    _write(tmp_path / "ok" / "a", ["p1"])
    done = CliRunner().invoke(check_runs, [str(tmp_path / "ok")])
    assert done.exit_code == 0 and "1 of 1 run folders read whole" in done.output
    (tmp_path / "empty").mkdir()
    done = CliRunner().invoke(check_runs, [str(tmp_path / "empty")])
    assert done.exit_code == 1 and "no run folder" in done.output

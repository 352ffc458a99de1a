"""The vLLM engine's pure parts (no vLLM needed): method mapping, option routing, rounds from vLLM's metrics,
records that the summary reads like ours. The real vLLM runs are in ``test_vllm_integration.py``."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace
from typing import Literal

import pytest

from dspark_bench.engines.vllm.llm import (
    VllmError,
    VllmRequest,
    counter_delta,
    counter_values,
    finish_of,
    parse_engine_options,
    record_of,
    rounds_from_counters,
    rounds_from_steps,
    speculative_config,
    split_engine_options,
)
from dspark_bench.evaluation.metrics import count_rounds, summarize


def test_drafters_map_to_vllm_methods():
    assert speculative_config("none", 5) is None
    assert speculative_config("ngram", 5) == {"method": "ngram", "num_speculative_tokens": 5,
                                              "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert speculative_config("ngram", 4, {"max_ngram": "5", "min_ngram": "2"}, {"enable_adaptive_verification": True}) \
        == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 2,
            "enable_adaptive_verification": True}
    assert speculative_config("eagle3", 3, {"model": "/x/e3"})["model"] == "/x/e3"


@pytest.mark.parametrize("drafter", ["eagle3", "dflash", "dspark", "draft_model"])
def test_model_methods_without_a_checkpoint_say_what_vllm_supports(drafter):
    with pytest.raises(VllmError, match=rf"{drafter}.model=PATH.*{drafter} proposers for"):
        speculative_config(drafter, 3)


def test_unknown_methods_and_options_are_errors():
    with pytest.raises(VllmError, match="methods: none, ngram"):
        speculative_config("blockdraft", 3)
    with pytest.raises(VllmError, match="ngram.window"):
        speculative_config("ngram", 3, {"window": "2"})


def test_engine_options_parse_json_and_route_to_their_config():
    opts = parse_engine_options(["tensor_parallel_size=2", "enable_adaptive_verification=true", "name=abc",
                                 "speculative.draft_tensor_parallel_size=1"])
    assert opts == {"tensor_parallel_size": 2, "enable_adaptive_verification": True, "name": "abc",
                    "speculative.draft_tensor_parallel_size": 1}
    llm, spec = split_engine_options({k: v for k, v in opts.items() if k != "name"}, {"tensor_parallel_size"},
                                     {"enable_adaptive_verification"})
    assert llm == {"tensor_parallel_size": 2}
    assert spec == {"enable_adaptive_verification": True, "draft_tensor_parallel_size": 1}
    with pytest.raises(VllmError, match="not an argument of vllm.EngineArgs"):
        split_engine_options({"name": "abc"}, {"model"}, set())
    with pytest.raises(VllmError, match="KEY=VALUE"):
        parse_engine_options(["tensor_parallel_size"])


def test_rounds_from_steps_fill_undrafted_steps_and_cut_the_stop():
    # 10 tokens: 1 from prefill, drafted steps commit 3 + 1 + 2, so 3 decode steps had no draft
    assert rounds_from_steps([3, 3, 2], [2, 0, 1], 10) == ((3, 3, 2, 3), (3, 3, 0, 1), (2, 2, 1, 2),
                                                            (0, 0, 0, 1), (0, 0, 0, 1), (0, 0, 0, 1))
    # the last step accepted 3 but max_tokens (or EOS) kept only 2 of its 4 tokens
    assert rounds_from_steps([3, 3], [3, 3], 7) == ((3, 3, 3, 4), (3, 3, 3, 2))
    assert rounds_from_steps([], [], 5) == ((0, 0, 0, 1),) * 4
    with pytest.raises(VllmError, match="more than"):
        rounds_from_steps([3], [3], 1)


def test_rounds_from_counters_rebuild_the_histogram():
    # 4 drafts of 9 tokens: accepted 0, 1, 2, 2 (at least 1: 3, at least 2: 2, at least 3: 0)
    delta = {"num_drafts": 4, "num_draft_tokens": 9, "num_accepted_tokens": 5, "accepted_per_pos": [3, 2, 0]}
    rounds = rounds_from_counters(delta, 1 + 9 + 1)
    c = count_rounds(rounds, 3)
    # our histogram counts every round: the one undrafted decode step is a round that accepted 0
    assert c.histogram == (2, 1, 2, 0) and c.accepted == 5 and c.proposed == 9
    assert c.accepted_at == (3, 2, 0) and c.committed == 10 and c.rounds == 5


def _metric(name, value=None, values=None):
    return SimpleNamespace(name=name, value=value, values=values)


def test_counters_sum_over_engines_and_difference():
    before = counter_values([_metric("vllm:spec_decode_num_drafts", 2), _metric("vllm:spec_decode_num_drafts", 1),
                             _metric("vllm:spec_decode_num_draft_tokens", 6),
                             _metric("vllm:spec_decode_num_accepted_tokens", 2),
                             _metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[2, 0, 0]),
                             _metric("vllm:num_requests_running", 3)])
    after = {**before, "num_drafts": 7, "num_draft_tokens": 18, "accepted_per_pos": [5, 1, 0]}
    assert before["num_drafts"] == 3
    assert counter_delta(before, after) == {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 0,
                                            "accepted_per_pos": [3, 1, 0]}


def _output(tokens, reason, first=10.0, last=12.0, ttft=0.5, scheduled=0.0):
    stats = SimpleNamespace(first_token_ts=first, last_token_ts=last, first_token_latency=ttft, scheduled_ts=scheduled)
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, finish_reason=reason)], metrics=stats)


def test_records_summarize_like_our_engine():
    req = VllmRequest((1, 2, 3), 980406, "gsm8k", "math", "gsm8k-0001", 0)
    none = record_of(req, "none", 0, 1, _output([5] * 9, "length"), rounds_from_steps([], [], 9))
    ngram = record_of(req, "ngram", 0, 1, _output([5] * 9, "stop", last=11.0),
                      rounds_from_steps([3, 3], [3, 1], 9))
    assert ngram.finish == "eos" and none.finish == "length" and ngram.decode_s == 1.0 and ngram.ttft_s == 0.5
    summary = summarize([none, ngram], 3)
    by = {g["drafter"]: g for g in summary["groups"] if g["scope"] == "all"}
    assert by["none"]["tau"] == 1.0
    assert by["ngram"]["tau"] == pytest.approx(8 / 4)  # rounds (3,3,3,4) (3,3,1,2) + two undrafted
    assert by["ngram"]["speedup_vs_none"] == pytest.approx(2.0)  # 8 tokens in 1 s vs 2 s
    assert by["ngram"]["histogram"] == [2, 1, 0, 1]
    assert finish_of(None) == "error"


def test_ttft_counts_from_admission_not_from_arrival():
    """Queued behind max_num_seqs from 2.0 to 9.6, scheduled at 9.6, first token at 10.0: TTFT 0.4, as our engine
    counts it; without a scheduled timestamp, vLLM's own first_token_latency."""
    req = VllmRequest((1, 2, 3), 980406, "gsm8k", "math", "gsm8k-0001", 0)
    held = record_of(req, "none", 0, 4, _output([5] * 3, "length", ttft=8.0, scheduled=9.6), rounds_from_steps([], [], 3))
    assert held.ttft_s == pytest.approx(0.4)
    assert record_of(req, "none", 0, 4, _output([5] * 3, "length", ttft=8.0), rounds_from_steps([], [], 3)).ttft_s == 8.0


def test_requests_go_in_one_call_when_vllm_holds_the_concurrency():
    from dspark_bench.engines.vllm.run import groups

    reqs = [VllmRequest((i,), i, "d", "math", f"p{i}", i) for i in range(5)]
    assert groups(reqs, 2, hold=True) == [reqs]
    assert groups(reqs, 2, hold=False) == [reqs[0:2], reqs[2:4], reqs[4:5]]
    assert groups([], 2, hold=True) == []


# ---- checks before vLLM starts (fakes of vLLM's option classes; no vLLM needed) ----------------------------
@dataclasses.dataclass
class _FakeEngineArgs:
    model: str = ""
    seed: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    hf_overrides: dict | None = None


@dataclasses.dataclass
class _FakeSpeculativeConfig:
    enable_adaptive_verification: bool = False


@pytest.fixture
def fake_vllm_options(monkeypatch):
    """vLLM's EngineArgs and SpeculativeConfig replaced by small dataclasses of the same kinds of fields."""
    from dspark_bench.engines.vllm import llm

    monkeypatch.setattr(llm, "option_classes", lambda: (_FakeEngineArgs, _FakeSpeculativeConfig))
    monkeypatch.setattr(llm, "platform_defaults", lambda: {})


@pytest.mark.parametrize("item, needle", [
    ("seed=abc", 'seed="abc": vLLM takes int or null for seed'),
    ("seed=true", "seed=true: vLLM takes int or null"),
    ("seed=1.5", "seed=1.5"),
    ("enforce_eager=1", "enforce_eager=1: vLLM takes bool"),
    ("kv_cache_dtype=3", "kv_cache_dtype=3: vLLM takes str"),
    ("enable_adaptive_verification=yes", "vLLM takes bool for enable_adaptive_verification"),
])
def test_engine_options_of_the_wrong_type_are_refused_before_vllm_starts(fake_vllm_options, item, needle):
    from dspark_bench.engines.vllm.llm import split_options

    with pytest.raises(VllmError, match=re.escape(needle)):
        split_options(parse_engine_options([item]))


def test_engine_options_of_the_right_type_and_unchecked_kinds_pass(fake_vllm_options):
    from dspark_bench.engines.vllm.llm import check_option_types, split_options

    fixes, llm, spec = split_options(parse_engine_options(
        ["seed=3", "seed=null", "gpu_memory_utilization=1", "kv_cache_dtype=fp8", 'hf_overrides={"a": 1}',
         "enable_adaptive_verification=true"]))
    assert llm == {"seed": None, "gpu_memory_utilization": 1, "kv_cache_dtype": "fp8", "hf_overrides": {"a": 1}}
    assert spec == {"enable_adaptive_verification": True} and fixes == ()

    @dataclasses.dataclass
    class Unresolvable:
        seed: NoSuchType = None  # noqa: F821 - an annotation this process cannot resolve is left to vLLM

    check_option_types({"seed": "abc"}, Unresolvable)


class _Tokenizer:
    """One id per character, no chat template."""

    chat_template = None

    def __call__(self, text, **kwargs):
        return {"input_ids": [3 + (ord(c) % 90) for c in text]}


def test_a_prompt_beyond_max_model_len_is_refused_or_cut():
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.vllm.run import context_limit, vllm_requests
    from dspark_bench.evaluation.suites import Prompt

    config = SimpleNamespace(max_position_embeddings=8192)
    prompts = [Prompt("ds", "custom", "p0", 0, "a" * 10), Prompt("ds", "custom", "p1", 1, "b" * 30)]
    limit = context_limit({"max_model_len": 32}, config)
    assert limit == (32, "--engine-opt max_model_len") and context_limit({}, config)[0] == 8192
    with pytest.raises(ValueError, match=r"prompt p1 \(ds\) has 30 tokens.* beyond --engine-opt max_model_len of 32"):
        vllm_requests(_Tokenizer(), prompts, RunSpec(max_new_tokens=8), limit)
    requests, cut = vllm_requests(_Tokenizer(), prompts, RunSpec(max_new_tokens=8, truncate="right"), limit)
    assert [len(r.prompt_ids) for r in requests] == [10, 24] and requests[1].seed == 980406 + 1
    assert cut == [{"dataset": "ds", "prompt_id": "p1", "prompt_tokens": 30, "kept_tokens": 24}]
    with pytest.raises(VllmError, match="max_model_len='long': give a positive integer"):
        context_limit({"max_model_len": "long"}, config)


def test_max_model_len_leaves_room_for_a_block_within_the_targets_context(fake_vllm_options):
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.vllm.run import settings_for

    spec = RunSpec(drafters=("none",), max_new_tokens=8, block_size=3)
    requests = [VllmRequest((1,) * 50, 1, "d", "custom", "p", 0)]
    assert settings_for(spec, "m", requests, {}, None)["none"].max_model_len == 50 + 8 + 3 + 1
    assert settings_for(spec, "m", requests, {}, 60)["none"].max_model_len == 60
    assert settings_for(spec, "m", requests, {"max_model_len": 59}, 60)["none"].max_model_len == 59


def _fake_run(monkeypatch, tmp_path, open_llm):
    """A VllmRun of two drafters whose tokenizer, config and LLM are fakes."""
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.vllm import run as vrun
    from dspark_bench.evaluation.suites import Prompt
    from dspark_bench.target import model

    req = VllmRequest((1, 2, 3), 980406, "ds", "custom", "p0", 0)
    monkeypatch.setattr(vrun, "require_vllm", lambda: None)
    monkeypatch.setattr(model, "resolve_target", lambda name, cache_dir=None: "fake-model")
    config = SimpleNamespace(vocab_size=96, num_hidden_layers=1, hidden_size=8, architectures=[],
                             max_position_embeddings=64)
    monkeypatch.setattr(vrun, "fitted_requests", lambda *a: (config, [req], []))
    monkeypatch.setattr(vrun, "open_llm", open_llm)
    spec = RunSpec(drafters=("none", "ngram"), max_new_tokens=8, warmup=False)
    prompts = [Prompt("ds", "custom", "p0", 0, "abc")]
    return vrun.VllmRun(spec, prompts, tmp_path / "run"), req


def test_a_vllm_run_that_fails_to_start_leaves_nothing_that_blocks_a_rerun(fake_vllm_options, monkeypatch, tmp_path):
    def refuse(settings, name):
        raise VllmError("seed: Input should be a valid integer")

    run, _ = _fake_run(monkeypatch, tmp_path, refuse)
    with pytest.raises(VllmError, match="valid integer"):
        run.execute()
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()  # a folder the user made is kept, emptied of what the run wrote
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(VllmError):
        run.execute()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["notes.txt"]


def test_a_vllm_run_that_fails_after_recording_keeps_its_records(fake_vllm_options, monkeypatch, tmp_path):
    from dspark_bench.evaluation.runs import read_records

    def first_only(settings, name):
        if name == "ngram":
            raise VllmError("out of memory")
        engine = SimpleNamespace(holds_concurrency=True, counter_check=[], wall_s=1.0, output_tokens=9,
                                 per_request=False, drafter=name, close=lambda: None)
        engine.run = lambda group, *a: [record_of(req, name, 0, 1, _output([5] * 9, "length"),
                                                  rounds_from_steps([], [], 9))]
        return engine

    run, req = _fake_run(monkeypatch, tmp_path, first_only)
    with pytest.raises(VllmError, match="out of memory"):
        run.execute()
    assert [r.drafter for r in read_records(tmp_path / "run")] == ["none"]
    assert (tmp_path / "run" / "manifest.json").is_file()


def test_a_vllm_run_fills_system_tokens_per_s_from_its_generate_calls(fake_vllm_options, monkeypatch, tmp_path):
    """Output tokens over the generate calls' wall time, per drafter: in the summary by drafter and in each
    drafter's group over all prompts (vLLM's rounds carry no timings); per-dataset groups keep None."""
    def fake(settings, name):
        engine = SimpleNamespace(holds_concurrency=True, counter_check=[], wall_s=0.0, output_tokens=0,
                                 per_request=False, drafter=name, close=lambda: None)

        def run(group, *a):
            engine.wall_s += 2.0 if name == "none" else 1.0
            engine.output_tokens += 9
            return [record_of(req, name, 0, 1, _output([5] * 9, "length"), rounds_from_steps([], [], 9))]

        engine.run = run
        return engine

    run, req = _fake_run(monkeypatch, tmp_path, fake)
    summary = run.execute()
    assert summary["system_tokens_per_s"] == {"none": 4.5, "ngram": 9.0}
    rates = {(g["drafter"], g["scope"]): g["system_tokens_per_s"] for g in summary["groups"]}
    assert rates["none", "all"] == 4.5 and rates["ngram", "all"] == 9.0
    assert rates["none", "dataset"] is None and rates["ngram", "domain"] is None
    import json

    assert json.loads((tmp_path / "run" / "summary.json").read_text())["groups"] == summary["groups"]


def test_cpu_workers_omp_settings_are_read_for_this_process_s_workers_only(tmp_path):
    import os

    from dspark_bench.engines.vllm.llm import worker_omp

    me = os.getpid()
    for pid, ppid, name, env in [(me, 1, "python", ""), (101, me, "VLLM::EngineCor", "OMP_NUM_THREADS=9"),
                                 (102, 101, "VLLM::Worker", "A=1\0OMP_NUM_THREADS=2\0GOMP_CPU_AFFINITY=0 1\0"),
                                 (103, 1, "VLLM::Worker", "OMP_NUM_THREADS=4")]:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} 0 0\n")
        (tmp_path / str(pid) / "environ").write_bytes(env.encode())
    assert worker_omp(tmp_path) == [{"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1"}]
    assert worker_omp(tmp_path / "none") == []

"""Metrics from hand-made records, result files round trip, and a run that crashes keeps what it wrote."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import tiny_target

from dspark_bench import metrics
from dspark_bench.results import RequestRecord, ResultsError, read_records, record_from_dict, record_to_dict
from dspark_bench.runner import Run, RunSpec
from dspark_bench.suites import Prompt


def _rec(rounds, drafter="d", decode_s=1.0, repeat=0, prompt_id="a", n_out=None):
    n_out = n_out if n_out is not None else 1 + sum(r[3] for r in rounds)
    return RequestRecord(
        drafter=drafter, scheduler="fixed", dataset="ds", domain="math", prompt_id=prompt_id, index=0,
        repeat=repeat, seed=1, concurrency=1, status="ok", finish="length", prompt_len=3,
        output_ids=tuple(range(n_out)), rounds=tuple(rounds), timings=tuple((0.1, 0.2, 0.0, 0.01) for _ in rounds),
        ttft_s=0.5, decode_s=decode_s,
    )


def test_acceptance_counts_by_hand():
    # gamma = 3; rounds as [proposed, verified, accepted, committed]
    rounds = [(3, 3, 3, 4), (3, 3, 1, 2), (3, 2, 0, 1), (3, 1, 1, 2)]
    c = metrics.count_rounds(rounds, 3)
    assert c.verified_at == (4, 3, 2)
    assert c.examined_at == (4, 2, 1)  # x_2 tested in rounds 1, 2; x_3 only in round 1
    assert c.accepted_at == (3, 1, 1)
    assert c.histogram == (1, 2, 0, 1)
    m = metrics.acceptance(c)
    assert m["tau"] == pytest.approx(9 / 4)
    assert m["acceptance_rate"] == pytest.approx(5 / 12)
    assert m["waste"] == pytest.approx((9 - 5) / 9)
    assert m["positions"]["marginal_survival"] == pytest.approx([3 / 4, 1 / 4, 1 / 4])
    assert m["positions"]["survival_reached"] == pytest.approx([3 / 4, 1 / 3, 1 / 2])
    assert m["positions"]["conditional"] == pytest.approx([3 / 4, 1 / 2, 1 / 1])


def test_speedup_and_tokens_per_s_pair_repeats():
    none = [_rec([(0, 0, 0, 1)] * 10, "none", decode_s=2.0, repeat=r) for r in range(3)]
    fast = [_rec([(3, 3, 1, 2)] * 5, "ngram", decode_s=d, repeat=r) for r, d in enumerate((1.0, 0.5, 1.0))]
    summary = metrics.summarize(none + fast, gamma=3)
    g = next(x for x in summary["groups"] if x["drafter"] == "ngram" and x["scope"] == "all")
    assert g["tokens_per_s_repeats"] == pytest.approx([10.0, 20.0, 10.0])
    assert g["speedup_vs_none_repeats"] == pytest.approx([2.0, 4.0, 2.0])
    assert g["speedup_vs_none"] == pytest.approx(2.0)
    assert g["tau"] == pytest.approx(2.0)


def test_bootstrap_interval_contains_tau():
    recs = [_rec([(3, 3, a, a + 1)] * 4, prompt_id=str(a)) for a in (0, 1, 2, 3, 1, 2)]
    lo, hi = metrics.tau_bootstrap(recs, n_boot=500, seed=1)
    tau = metrics.acceptance(metrics.count_rounds([x for r in recs for x in r.rounds], 3))["tau"]
    assert lo <= tau <= hi and lo < hi


def test_record_round_trip_and_unknown_keys():
    rec = _rec([(3, 3, 1, 2)])
    data = json.loads(json.dumps(record_to_dict(rec)))
    assert record_from_dict(data) == rec
    data["surprise"] = 1
    with pytest.raises(ResultsError, match="surprise"):
        record_from_dict(data)


def test_crash_mid_run_keeps_written_records(tmp_path, monkeypatch):
    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt number {i} abc") for i in range(3)]
    calls = {"n": 0}
    real = target.forward_block

    def flaky(batch, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 60:
            raise KeyboardInterrupt  # a crash that is not a per-request error
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(target, "forward_block", flaky)
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=20, warmup=False)
    with pytest.raises(KeyboardInterrupt):
        Run(spec, target, prompts, tmp_path / "run").execute()
    recs = read_records(tmp_path / "run")
    assert 1 <= len(recs) < 6 and all(r.ok for r in recs)
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["schema_version"] == 1


def test_run_writes_summary(tmp_path, monkeypatch):
    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} xyz") for i in range(2)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=16, repeats=2)
    summary = Run(spec, target, prompts, tmp_path / "run").execute()
    groups = {(g["drafter"], g["scope"]): g for g in summary["groups"]}
    assert groups[("none", "all")]["tau"] == 1.0
    assert groups[("ngram", "all")]["n_requests"] == 2
    assert len(groups[("ngram", "all")]["speedup_vs_none_repeats"]) == 2
    assert len(read_records(tmp_path / "run")) == 8


def test_manifest_records_the_architecture_a_checkpoint_loads(tmp_path, monkeypatch):
    """Options left at their defaults (num_layers = 1) must not hide a loaded 2-layer RNN-head checkpoint."""
    from dspark_bench.drafters import registry

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    saved = registry.create("dspark", target, {"num_layers": 2, "markov_rank": 8, "markov_head_type": "rnn"})
    folder = saved.save(tmp_path / "ck")
    prompts = [Prompt("ds", "custom", "p0", 0, "prompt xyz")]
    spec = RunSpec(target="tiny", drafters=("dspark",), drafter_options={"dspark": {"checkpoint": str(folder)}},
                   max_new_tokens=4, warmup=False)
    Run(spec, target, prompts, tmp_path / "run").execute()
    entry = json.loads((tmp_path / "run" / "manifest.json").read_text())["drafters"]["dspark"]
    assert entry["config"]["num_layers"] == 1  # the option's default, as given
    assert entry["architecture"]["num_layers"] == 2 and entry["architecture"]["markov_head_type"] == "rnn"


def test_records_are_read_from_a_gzipped_copy(tmp_path):
    import gzip

    line = json.dumps(record_to_dict(_rec([(7, 7, 2, 3)]))) + "\n"
    (tmp_path / "records.jsonl.gz").write_bytes(gzip.compress(line.encode()))
    assert [r.rounds for r in read_records(tmp_path)] == [((7, 7, 2, 3),)]
    with pytest.raises(ResultsError, match=r"has no records.jsonl \(or records.jsonl.gz\)"):
        read_records(tmp_path / "nothing")


def test_merge_joins_the_parts_of_one_run_and_refuses_others(tmp_path, monkeypatch):
    from dspark_bench.results import merge_runs, read_manifest

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt {i} xyz") for i in range(4)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=8, warmup=False)
    Run(spec, target, prompts[:2], tmp_path / "a").execute()
    Run(dataclasses.replace(spec, skip=2), target, prompts[2:], tmp_path / "b").execute()
    summary = merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    assert len(read_records(tmp_path / "ab")) == 8
    assert {g["n_requests"] for g in summary["groups"] if g["scope"] == "all"} == {4}
    manifest = read_manifest(tmp_path / "ab")
    assert [p["prompt_id"] for p in manifest["prompts"]] == ["p0", "p1", "p2", "p3"]
    assert [part["args"]["skip"] for part in manifest["parts"]] == [0, 2]
    with pytest.raises(ResultsError, match="must be disjoint"):
        merge_runs([tmp_path / "a", tmp_path / "ab"], tmp_path / "x")
    with pytest.raises(ResultsError, match="decoded no dataset other; it has ds"):
        merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "z", [None, {"other"}])
    merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "sel", [{"ds"}, None])
    assert len(read_records(tmp_path / "sel")) == 8
    assert [part["datasets"] for part in read_manifest(tmp_path / "sel")["parts"]] == [["ds"], "all"]
    Run(dataclasses.replace(spec, max_new_tokens=6), target, prompts[2:], tmp_path / "c").execute()
    with pytest.raises(ResultsError, match="differs from .* in max_new_tokens"):
        merge_runs([tmp_path / "a", tmp_path / "c"], tmp_path / "y")


def test_complete_chunks_drop_the_quick_finishers_of_a_stopped_chunk():
    from dspark_bench.results import complete_chunks

    manifest = {"args": {"concurrency": 2, "drafters": ["none", "d"], "repeats": 1},
                "prompts": [{"dataset": "ds", "prompt_id": p} for p in ("a", "b", "c", "d", "e")]}
    recs = [_rec([(7, 7, 1, 2)], drafter=d, prompt_id=p) for p in "abc" for d in ("none", "d")]
    recs.append(_rec([(7, 7, 1, 2)], drafter="none", prompt_id="d"))
    assert [p["prompt_id"] for p in complete_chunks(manifest, recs)] == ["a", "b"]  # c's partner d is unfinished

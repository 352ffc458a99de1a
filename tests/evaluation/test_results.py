"""Metrics from hand-made records, result files round trip, and a run that crashes keeps what it wrote."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import tiny_target

from dspark_bench.core.records import RequestRecord, ResultsError, record_from_dict, record_to_dict
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation import metrics
from dspark_bench.evaluation.runs import read_records
from dspark_bench.evaluation.suites import Prompt


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


def _coverage_runs(n_runs=200, prompts=40, rounds=20, gamma=7, seed=0):
    """Simulated runs with a known tau: prompt i accepts each draft token with its own p_i ~ Beta(2, 5), and a
    round commits 1 + Binomial(gamma, p_i) tokens, so tau = 1 + gamma * E[p] = 3 exactly."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(n_runs):
        p = rng.beta(2, 5, size=prompts)
        accepted = rng.binomial(gamma, p[:, None], size=(prompts, rounds))
        yield [_rec([(gamma, gamma, int(a), int(a) + 1) for a in row], prompt_id=str(i))
               for i, row in enumerate(accepted)]


def test_bootstrap_interval_covers_a_known_tau_95_percent_of_the_time():
    import numpy as np

    true_tau, hits, naive_hits, n = 3.0, 0, 0, 0
    for n, recs in enumerate(_coverage_runs(), 1):
        lo, hi = metrics.tau_bootstrap(recs, n_boot=1000, seed=n)
        hits += lo <= true_tau <= hi
        # the same percentile interval resampling rounds instead of prompts: blind to the prompts' spread
        rows = np.array([r[3] for rec in recs for r in rec.rounds], float)
        boot = np.random.default_rng(n).choice(rows, size=(1000, len(rows))).mean(1)
        naive_hits += bool(np.quantile(boot, 0.025) <= true_tau <= np.quantile(boot, 0.975))
    assert 0.90 <= hits / n <= 0.985, f"95% interval covered the true tau in {hits} of {n} runs"
    assert naive_hits / n < 0.85, f"the check cannot tell a too-narrow interval: it covered {naive_hits} of {n}"


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
    from dspark_bench.engines.native.loop import RoundLoop

    finished, real_session = [], RoundLoop.session

    def watched(self, requests, on_result):  # what the engine reports as finished, before any write
        def seen(res):
            finished.append((self.drafter.name, res.request.prompt_id))
            on_result(res)

        return real_session(self, requests, seen)

    monkeypatch.setattr(RoundLoop, "session", watched)  # the runner steps engine sessions (RoundLoop.run does too)
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=20, warmup=False)
    with pytest.raises(KeyboardInterrupt):
        Run(spec, target, prompts, tmp_path / "run").execute()
    recs = read_records(tmp_path / "run")
    assert 1 <= len(finished) < 6  # the crash came mid-run, after some requests finished
    assert sorted((r.drafter, r.prompt_id) for r in recs) == sorted(finished) and all(r.ok for r in recs)
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
    from dspark_bench.evaluation.runs import merge_runs, read_manifest

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


def test_complete_prompts_drop_the_quick_finishers_after_an_unfinished_request():
    from dspark_bench.evaluation.runs import complete_prompts

    manifest = {"args": {"concurrency": 2, "drafters": ["none", "d"], "repeats": 1},
                "prompts": [{"dataset": "ds", "prompt_id": p} for p in ("a", "b", "c", "d", "e")]}
    recs = [_rec([(7, 7, 1, 2)], drafter=d, prompt_id=p) for p in "abce" for d in ("none", "d")]
    recs.append(_rec([(7, 7, 1, 2)], drafter="none", prompt_id="d"))
    # d is unfinished for drafter d; e, admitted after it, finished first: it goes too
    assert [p["prompt_id"] for p in complete_prompts(manifest, recs)] == ["a", "b", "c"]


def _part(folder, prompts, drafters=("none", "d"), concurrency=2, missing=(), tag=0):
    """A run folder written by hand: ``prompts`` as (dataset, prompt id); a record for every drafter of every
    prompt except the (drafter, prompt id) pairs in ``missing``; ``tag`` marks the part in each record's seed."""
    from dspark_bench.evaluation.runs import MANIFEST, RECORDS, SCHEMA_VERSION

    folder.mkdir(parents=True)
    args = {"target": "tiny", "drafters": list(drafters), "drafter_options": {}, "scheduler": "fixed",
            "scheduler_options": {}, "profile": None, "max_new_tokens": 4, "temperature": 1.0, "block_size": 7,
            "seed": 1, "dtype": "fp32", "repeats": 1, "concurrency": concurrency, "limit": None, "skip": 0}
    entries = [{"dataset": ds, "domain": "math", "prompt_id": pid, "index": i} for i, (ds, pid) in enumerate(prompts)]
    (folder / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION, "args": args, "prompts": entries}))
    lines = [dataclasses.replace(_rec([(7, 7, 1, 2)], drafter=d, prompt_id=pid), dataset=ds, seed=tag)
             for ds, pid in prompts for d in drafters if (d, pid) not in missing]
    (folder / RECORDS).write_text("".join(json.dumps(record_to_dict(r)) + "\n" for r in lines))


def _keys_and_parts(folder):
    return sorted((r.drafter, r.dataset, r.prompt_id, r.seed) for r in read_records(folder))


def test_merge_drops_the_records_of_datasets_a_selection_leaves_out(tmp_path):
    from dspark_bench.evaluation.runs import merge_runs, read_manifest

    # part a decoded gsm8k and chat; chat's prompts were decoded again by part b, which alone contributes them
    _part(tmp_path / "a", [("gsm8k", "g0"), ("gsm8k", "g1"), ("chat", "c0"), ("chat", "c1")], tag=1)
    _part(tmp_path / "b", [("chat", "c0"), ("chat", "c1")], tag=2)
    merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "ab", [{"gsm8k"}, None])
    got = _keys_and_parts(tmp_path / "ab")
    assert len(got) == 8
    assert {(ds, seed) for _, ds, _, seed in got} == {("gsm8k", 1), ("chat", 2)}
    parts = read_manifest(tmp_path / "ab")["parts"]
    assert [(p["prompts"], p["prompts_left_out"], p["records_left_out"]) for p in parts] == [(2, 2, 4), (2, 0, 0)]


def test_merge_drops_an_incomplete_tail_that_another_part_decoded_again(tmp_path):
    from dspark_bench.evaluation.runs import merge_runs, read_manifest

    # part a stopped at p2: only none's p2 finished; part b decoded p2 and p3 again
    _part(tmp_path / "a", [("ds", "p0"), ("ds", "p1"), ("ds", "p2"), ("ds", "p3")],
          missing={("d", "p2"), ("none", "p3"), ("d", "p3")}, tag=1)
    _part(tmp_path / "b", [("ds", "p2"), ("ds", "p3")], tag=2)
    summary = merge_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    got = _keys_and_parts(tmp_path / "ab")
    assert [(pid, seed) for d, _, pid, seed in got if d == "none"] == [("p0", 1), ("p1", 1), ("p2", 2), ("p3", 2)]
    assert len(got) == 8
    assert {g["n_requests"] for g in summary["groups"] if g["scope"] == "all"} == {4}
    parts = read_manifest(tmp_path / "ab")["parts"]
    assert [(p["prompts"], p["prompts_left_out"], p["records_left_out"]) for p in parts] == [(2, 2, 1), (2, 0, 0)]


def test_read_records_refuses_a_duplicated_key(tmp_path):
    lines = [json.dumps(record_to_dict(_rec([(7, 7, k, k + 1)], prompt_id="p9"))) + "\n" for k in (1, 2)]
    (tmp_path / "records.jsonl").write_text("".join(lines))
    with pytest.raises(ResultsError, match=r"records.jsonl:2: drafter d, dataset ds, prompt p9, repeat 0 is "
                                           r"already recorded on line 1"):
        read_records(tmp_path)
    other = json.dumps(record_to_dict(_rec([(7, 7, 1, 2)], prompt_id="p9", repeat=1))) + "\n"
    (tmp_path / "records.jsonl").write_text(lines[0] + other)
    assert [r.repeat for r in read_records(tmp_path)] == [0, 1]


def _tokens(folder):
    return {(r.drafter, r.prompt_id, r.repeat): r.output_ids for r in read_records(folder)}


def _crashing(target, monkeypatch, at: int):
    real, calls = target.forward_block, {"n": 0}

    def flaky(batch, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt  # a crash that is not a per-request error
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(target, "forward_block", flaky)
    return lambda: monkeypatch.setattr(target, "forward_block", real)


def test_resume_completes_a_crashed_run_with_the_tokens_of_a_clean_one(tmp_path, monkeypatch):
    """A run killed mid-way (and its last record line torn) is completed by ``resume``: every (drafter, prompt,
    repeat) once, each with the tokens an uninterrupted run decodes (fp32, counter-based draws)."""
    from dspark_bench.engines.native.runner import resume

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt number {i} abc") for i in range(5)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=16, repeats=2, concurrency=2,
                   warmup=False)
    Run(spec, target, prompts, tmp_path / "clean").execute()
    restore = _crashing(target, monkeypatch, at=40)
    with pytest.raises(KeyboardInterrupt):
        Run(spec, target, prompts, tmp_path / "run").execute()
    restore()
    kept = len(read_records(tmp_path / "run"))
    assert 1 <= kept < 20
    with open(tmp_path / "run" / "records.jsonl", "a") as f:
        f.write('{"drafter": "none", "dataset": "ds", "prom')  # a record the crash cut short
    summary, added = resume(tmp_path / "run", target, prompts)
    assert added == 20 - kept and _tokens(tmp_path / "run") == _tokens(tmp_path / "clean")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["unfinished"] == [] and manifest["resumed"][-1]["kept"] == kept
    assert manifest["resumed"][-1]["requests"] == 20 - kept and "finished" in manifest["resumed"][-1]
    assert {g["drafter"] for g in summary["groups"]} == {"none", "ngram"}
    assert resume(tmp_path / "run", target, prompts)[1] == 0  # a complete run: nothing to add


def test_resume_completes_what_a_dead_worker_left(tmp_path, monkeypatch):
    """Sharded run (the Ray path without Ray): worker 1 dies mid-shard; the joined folder lists its unfinished
    requests, and ``resume`` decodes exactly those, giving the single-process run's tokens."""
    from dspark_bench.engines.native.ray import join_shards, shard_chunks
    from dspark_bench.engines.native.runner import resume

    target = tiny_target("llama")
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", f"p{i}", i, f"prompt number {i} abc") for i in range(6)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=16, concurrency=1, warmup=False)
    Run(spec, target, prompts, tmp_path / "one").execute()
    shards = shard_chunks(len(prompts), spec.concurrency, 2)
    folders = [tmp_path / "two" / "shards" / f"worker-{i}" for i in range(2)]
    Run(spec, target, [prompts[j] for j in shards[0]], folders[0]).execute()
    restore = _crashing(target, monkeypatch, at=20)
    with pytest.raises(KeyboardInterrupt):
        Run(spec, target, [prompts[j] for j in shards[1]], folders[1]).execute()
    restore()
    join_shards(spec, prompts, tmp_path / "two", shards, folders, {0: "ok", 1: "failed: killed"}, None)
    unfinished = json.loads((tmp_path / "two" / "manifest.json").read_text())["unfinished"]
    lost = {(u["drafter"], u["prompt_id"]) for u in unfinished}
    assert lost and all(int(p[1:]) in shards[1] for _, p in lost)  # only the dead worker's requests
    _, added = resume(tmp_path / "two", target, prompts)
    assert added == len(lost) and _tokens(tmp_path / "two") == _tokens(tmp_path / "one")


def test_manifest_names_the_cpu_and_its_vector_extensions(tmp_path):
    """The manifest says which CPU ran: its model and which kernel-relevant extensions it has, read from
    /proc/cpuinfo (the first processor's lines); a machine without that file records None, not a guess."""
    from dspark_bench.evaluation.runs import CPU_FLAGS, cpu_features, environment

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 vnni\n\n"
                    "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert cpu_features(info) == {"model": "AMD EPYC 9R14", "flags": ["avx2", "avx512f", "avx512_bf16"]}
    info.write_text("processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: fpu sse2 avx avx2\n")
    assert cpu_features(info) == {"model": "Old CPU", "flags": ["avx2"]}
    assert cpu_features(tmp_path / "missing") is None
    cpu = environment()["machine"]["cpu"]
    assert cpu is None or set(cpu["flags"]) <= set(CPU_FLAGS)


def test_sampling_filters_in_manifests_old_and_new(tmp_path):
    """A manifest written before the filters were recorded reads as sampling without them: it merges with a part
    that records them off, resumes with them off, and a part with a filter on is another run."""
    from dspark_bench.engines.native.runner import spec_from_manifest
    from dspark_bench.evaluation.runs import MANIFEST, merge_runs, read_manifest

    _part(tmp_path / "old", [("ds", "a")])
    _part(tmp_path / "new", [("ds", "b")])
    _part(tmp_path / "topk", [("ds", "c")])
    for name, filters in (("new", {"top_p": 1.0, "top_k": 0, "min_p": 0.0}), ("topk", {"top_k": 20})):
        manifest = read_manifest(tmp_path / name)
        (tmp_path / name / MANIFEST).write_text(json.dumps({**manifest, "args": {**manifest["args"], **filters}}))
    spec = spec_from_manifest(read_manifest(tmp_path / "old"))
    assert (spec.top_p, spec.top_k, spec.min_p) == (1.0, 0, 0.0)
    assert spec_from_manifest(read_manifest(tmp_path / "topk")).sampling.top_k == 20
    merge_runs([tmp_path / "old", tmp_path / "new"], tmp_path / "merged")
    assert len(read_records(tmp_path / "merged")) == 4
    with pytest.raises(ResultsError, match="differs from .* in top_k"):
        merge_runs([tmp_path / "old", tmp_path / "topk"], tmp_path / "refused")

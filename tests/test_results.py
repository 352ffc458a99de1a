"""Metrics from hand-made records, result files round trip, and a run that crashes keeps what it wrote."""

from __future__ import annotations

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

    def flaky(batch, blocks, taps=()):
        calls["n"] += 1
        if calls["n"] == 60:
            raise KeyboardInterrupt  # a crash that is not a per-request error
        return real(batch, blocks, taps)

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

"""Divergence forensics on run folders: replays reproduce a run's laws, bf16 batch-shape divergences are judged
floating-point, a tampered token is unexplained, and the ``diverge`` command and ``run``'s greedy check say so.

The run folders are decoded here by the engine's loop on a tiny random-weight target in bf16 (where a batch of 4
rounds differently from a request alone often enough to diverge within 40 tokens); the replay's target and
requests are that target and those requests (``load_target`` / ``run_requests`` patched)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from conftest import random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.cli.main import main
from dspark_bench.core import rng
from dspark_bench.core.records import record_from_result
from dspark_bench.core.verify import sample
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.engines.native.runner import spec_from_manifest
from dspark_bench.evaluation import forensics as fx
from dspark_bench.evaluation.gate import snapshot
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import RunWriter, read_records, write_json
from dspark_bench.studies import diverge

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET = tiny_target("llama", layers=4, dtype=torch.bfloat16)
REQUESTS = [Request(i, tuple(p), 100 + i, "tiny", "code", f"p{i}") for i, p in enumerate(random_prompts(8, seed=3))]
NEW, BLOCK = 40, 4


@pytest.fixture(autouse=True)
def tiny_replays(monkeypatch):
    monkeypatch.setattr(diverge, "load_target", lambda args, cache_dir: TARGET)
    monkeypatch.setattr(diverge, "run_requests",
                        lambda run, target: (spec_from_manifest(run.manifest), [], list(REQUESTS)))


def _write_run(folder, names, concurrency, temperature=1.0, seed=100):
    """A run folder of ``names`` decoded by the loop at ``concurrency`` (what ``run`` would write, in small)."""
    spec = RunSpec(target="tiny", drafters=tuple(names), suite="tiny", limit=None, max_new_tokens=NEW,
                   temperature=temperature, block_size=BLOCK, seed=seed, dtype="bf16", concurrency=concurrency)
    manifest = {"schema_version": 1, "args": dataclasses.asdict(spec), "machine": {"torch_threads": 1},
                "prompts": [{"dataset": r.dataset, "domain": r.domain, "prompt_id": r.prompt_id,
                             "index": r.request_id} for r in REQUESTS]}
    config = EngineConfig(NEW, temperature, BLOCK, concurrency)
    records = []
    with RunWriter(folder, manifest) as writer:
        for name in names:
            results = []
            RoundLoop(TARGET, drafters.create(name, TARGET), config).run(REQUESTS, results.append)
            for res in results:
                records.append(record_from_result(res, name, "fixed", res.request.request_id, 0, concurrency))
                writer.add(records[-1])
    write_json(folder / "summary.json", summarize(records, BLOCK))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {c: _write_run(root / f"c{c}", ("none", "ngram"), c) for c in (1, 4)}


def _tamper(src, dst, index):
    """A copy of run ``src`` whose first ngram record that long has output token ``index`` replaced (a wrongly
    drawn token)."""
    dst.mkdir()
    for name in ("manifest.json", "summary.json"):
        (dst / name).write_text((src / name).read_text())
    lines = [json.loads(x) for x in (src / "records.jsonl").read_text().splitlines()]
    rec = next(r for r in lines if r["drafter"] == "ngram" and len(r["output_ids"]) > index)
    rec["output_ids"][index] = (rec["output_ids"][index] + 48) % 96
    (dst / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return rec["prompt_id"]


def _split_round(src, dst):
    """A copy of run ``src`` in which the first ngram record with a round that accepted a draft and drew a token
    after it tells another story: its last accepted draft was rejected and drawn anew as the same token, and the
    round's final token came from a round of its own, replaced by another token. The rounds part one token
    before the tokens do. Returns (prompt id, index of the parting, index of the replaced token)."""
    dst.mkdir()
    for name in ("manifest.json", "summary.json"):
        (dst / name).write_text((src / name).read_text())
    lines = [json.loads(x) for x in (src / "records.jsonl").read_text().splitlines()]
    for rec in (r for r in lines if r["drafter"] == "ngram"):
        made = 1  # output tokens before the round: the first token
        for n, (proposed, verified, accepted, committed) in enumerate(rec["rounds"]):
            if accepted >= 1 and committed == accepted + 1:
                rec["rounds"][n : n + 1] = [[proposed, verified, accepted - 1, accepted], [1, 1, 0, 1]]
                for key in ("timings", "batch", "waiting"):  # per-round columns keep one entry per round
                    if rec.get(key):
                        rec[key][n : n + 1] = [rec[key][n], rec[key][n]]
                changed = made + accepted
                rec["output_ids"][changed] = (rec["output_ids"][changed] + 48) % 96
                (dst / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
                return rec["prompt_id"], changed - 1, changed
            made += committed
    raise AssertionError("no ngram round accepted a draft: the fixture gives this test nothing to split")


def test_rounds_that_parted_before_the_tokens_are_judged_where_they_parted(runs, tmp_path):
    """A divergence whose token comes from rounds starting at other positions is judged at the token where the
    rounds parted. Here that parting is forged (an accepted draft recorded as rejected and redrawn), and the
    replay shows the draft's acceptance test passing in both runs: unexplained, at the parting."""
    prompt, parted, index = _split_round(runs[1], tmp_path / "split")
    out = tmp_path / "report.json"
    res = CliRunner().invoke(main, ["diverge", str(runs[1]), str(tmp_path / "split"), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert f"{prompt} #{index} (rounds parted #{parted})" in " ".join(res.output.split())
    (row,) = json.loads(out.read_text())["divergences"]
    assert row["index"] == index and row["rounds_parted"]["index"] == parted
    assert [d["kind"] for d in row["rounds_parted"]["draws"]] == [fx.DRAFT, fx.RECOVERED]
    assert row["draws"][0]["anchor"] != row["draws"][1]["anchor"]  # the token's rounds start apart
    assert row["decision"]["kind"] == "test" and row["decision"]["purpose"] == "ACCEPT"
    assert row["verdict"] == fx.UNEXPLAINED and row["law_difference"] == 0  # one law, replayed twice
    assert row["margins"][0] == pytest.approx(-row["margins"][1]) and row["margins"][0] > 0  # passed in both
    assert all(r["reproduced"] for r in row["replay"]) and "rounds parted at output token" in row["notes"][0]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_replay_reproduces_the_runs_tokens_and_uniforms(runs, concurrency):
    run = diverge.RunData.read(runs[concurrency])
    rec = next(r for r in run.records if r.drafter == "ngram" and r.prompt_id == "p2")
    sites = fx.draw_sites(rec.prompt_len, rec.rounds, len(rec.output_ids))
    wanted = {0, *(i for i, s in enumerate(sites) if s.kind in (fx.DRAFT, fx.RECOVERED))}
    laws = diverge.replay(TARGET, run, "ngram", {(rec.dataset, rec.prompt_id): {i: rec.output_ids[: i + 1]
                                                                                 for i in wanted}})
    assert sorted(i for _, i in laws) == sorted(wanted)
    for (_, i), law in laws.items():
        assert law.token == rec.output_ids[i] and law.prefix_equal
        site = sites[i]
        if site.kind in fx.TARGET_DRAWS:  # drawn from the captured weights with the keyed uniform
            u = float(rng.uniforms([rec.seed], [site.anchor], rng.TARGET)[0])
            assert law.u_token == u and int(sample(law.weights, torch.tensor(u, dtype=torch.float64))) == law.token
        else:  # an accepted n-gram draft passed its keyed test u < p(x)
            u = float(rng.uniforms([rec.seed], [site.position], rng.ACCEPT)[0])
            assert law.u_accept == u and u < fx.alpha_of(law.p, None, law.token)
        assert law.rows <= concurrency


def test_bf16_batch_divergences_are_floating_point(runs):
    report = diverge.compare_runs(diverge.RunData.read(runs[1]), diverge.RunData.read(runs[4]))
    rows = report["divergences"]
    assert rows, "bf16 at concurrency 1 and 4 should part somewhere in 8 x 40 tokens"
    assert report["drafters"]["none"]["requests"] == len(REQUESTS)
    for f in rows:
        assert f["verdict"] == fx.FLOATING, f
        assert all(r["reproduced"] and r["prefix_equal"] for r in f["replay"])  # the replays are the runs
        assert min(abs(m) for m in f["margins"]) <= f["law_difference"] < 0.5


def test_diverge_command(runs, tmp_path):
    cli = CliRunner()
    prompt = _tamper(runs[1], tmp_path / "tampered", index=6)
    out = tmp_path / "report.json"
    bad = cli.invoke(main, ["diverge", str(runs[1]), str(tmp_path / "tampered"), "--out", str(out)])
    assert bad.exit_code == 1, bad.output
    assert "unexplained divergence" in bad.output and f"{prompt} #6" in " ".join(bad.output.split())
    (row,) = json.loads(out.read_text())["divergences"]
    assert row["verdict"] == fx.UNEXPLAINED and row["index"] == 6 and row["replay"][1]["reproduced"] is False
    assert row["margins"][1] < -row["law_difference"]  # the tampered token's own law does not draw it
    same = cli.invoke(main, ["diverge", str(runs[1]), str(runs[1])])
    assert same.exit_code == 0 and "none: 8/8 requests equal" in same.output and "ngram: 8/8" in same.output
    other = _write_run(tmp_path / "seed", ("none",), 1, seed=7)
    refused = cli.invoke(main, ["diverge", str(runs[1]), str(other)])
    assert refused.exit_code == 2 and refused.output.startswith("error:"), refused.output
    assert "seed 100 vs 7" in " ".join(refused.output.split())
    merged = tmp_path / "merged"  # what `merge` writes: one manifest listing its parts
    merged.mkdir()
    manifest = json.loads((runs[4] / "manifest.json").read_text())
    manifest["parts"] = [{"folder": "part-a"}, {"folder": "part-b"}]
    (merged / "manifest.json").write_text(json.dumps(manifest))
    (merged / "records.jsonl").write_text((runs[4] / "records.jsonl").read_text())
    refused = cli.invoke(main, ["diverge", str(runs[1]), str(merged)])
    assert refused.exit_code == 2 and "joined by `dspark-bench merge` from 2 runs (part-a, part-b)" in " ".join(
        refused.output.split()), refused.output


def test_greedy_equality_is_judged_and_gated(tmp_path):
    folder = _write_run(tmp_path / "t0", ("none", "ngram"), 4, temperature=0.0)
    report = diverge.greedy_equality(folder)
    g = report["ngram"]
    assert g["requests"] == len(REQUESTS) and g["requests_equal"] + len(g["divergences"]) == len(REQUESTS)
    assert json.loads((folder / "summary.json").read_text())["greedy_equality"] == report
    for f in g["divergences"]:  # a near-tie of the argmax, flipped by a verify block rounding unlike a decode
        assert f["verdict"] == fx.FLOATING and f["decision"]["kind"] == "greedy", f
    assert g["unexplained"] == 0 and snapshot([folder])["drafters"]["ngram"]["greedy_equal"] is True
    _tamper(folder, tmp_path / "bad", index=5)
    report = diverge.greedy_equality(tmp_path / "bad")
    assert report["ngram"]["unexplained"] >= 1
    assert snapshot([tmp_path / "bad"])["drafters"]["ngram"]["greedy_equal"] is False
    assert diverge.greedy_equality(_write_run(tmp_path / "t1", ("none", "ngram"), 1)) is None  # sampled: no check
    assert len(read_records(folder)) == 2 * len(REQUESTS)

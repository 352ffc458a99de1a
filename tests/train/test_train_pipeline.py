"""Training pipeline: prompts, regeneration, tokenised sequences, feature cache, LR schedule, trainer + resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_target
from torch import nn

from dspark_bench.drafters import vocab
from dspark_bench.drafters.types import LossOutput
from dspark_bench.train import data, features, methods, prompts, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def sequences(n: int, seed: int = 0, lo: int = 24, hi: int = 40) -> list[data.TrainSequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        ids = torch.randint(3, 96, (length,), generator=g).tolist()
        out.append(data.TrainSequence(f"s{i:03d}", tuple(ids), int(torch.randint(4, 10, (1,), generator=g))))
    return out


# ---- prompts ------------------------------------------------------------------------------------------------
def test_prompts_are_disjoint_from_every_eval_prompt():
    from dspark_bench.evaluation.suites import load_suite

    evals = [p.text for p in load_suite("all", limit=None)]
    items = prompts.build_prompts(6144, seed=0)  # data/smollm2/train-6k; built without the guard: disjoint by construction
    texts = [p.text for p in items]
    assert len(set(texts)) == len(texts) == 6144 and len({p.id for p in items}) == 6144
    assert not set(texts) & set(evals)
    assert not {prompts.normalise(t) for t in texts} & {prompts.normalise(t) for t in evals}
    heads = {e[: prompts.HEAD_CHARS] for e in evals}
    assert not [(h, t) for h in heads for t in texts if h in t]
    counts = {d: sum(p.domain == d for p in items) for d in ("math", "code", "chat")}
    assert counts == {"math": 2459, "code": 2457, "chat": 1228}


def test_prompts_are_seeded_and_the_guard_rejects_collisions():
    a, b = prompts.build_prompts(300, seed=3), prompts.build_prompts(300, seed=3)
    assert a == b and a != prompts.build_prompts(300, seed=4)
    planted = a[0].text[:70]  # an "eval prompt" whose head appears in a training prompt
    guarded = prompts.build_prompts(300, seed=3, exclude=[planted])
    assert a[0].text not in {p.text for p in guarded} and len(guarded) == 300


# ---- regeneration and sequences -----------------------------------------------------------------------------
def render(text: str) -> list[int]:
    return [3 + ord(c) % 90 for c in text[:12]]


def test_generation_resumes_to_the_same_file(target, tmp_path):
    items = prompts.build_prompts(10, seed=1)
    spec = data.GenerationSpec("tiny", n=10, seed=5, max_new_tokens=10, batch_size=3, shard_size=4, dtype="fp32")
    whole = tmp_path / "whole"
    assert data.generate(target, items, whole, spec, render=render) == 10
    parts = tmp_path / "parts"
    assert data.generate(target, items, parts, spec, render=render, max_shards=1) == 4
    with (parts / data.RESPONSES).open("a") as fh:  # a crash in the middle of the next shard
        fh.write(json.dumps({"id": "x", "shard": 1}) + "\n" + '{"id": "torn')
    assert data.generate(target, items, parts, spec, render=render) == 10
    assert (parts / data.RESPONSES).read_text() == (whole / data.RESPONSES).read_text()
    rows = data.read_rows(whole)
    assert [r["id"] for r in rows] == [p.id for p in items]
    assert all(r["finish_reason"] in ("stop", "length") and 2 not in r["response_ids"] for r in rows)
    with pytest.raises(data.DataError, match="other settings"):
        data.generate(target, items, whole, replace(spec, temperature=0.9), render=render)
    # a folder whose first shard is still being generated is a data folder with no rows yet
    started = tmp_path / "started"
    assert data.generate(target, items, started, spec, render=render, max_shards=0) == 0
    assert data.complete_rows(started) == [] and data.read_rows(started) == []


def test_loss_mask_covers_exactly_the_response():
    row = {"id": "a", "domain": "chat", "prompt": "hi", "prompt_ids": [1, 5, 6, 7], "response_ids": list(range(10, 30)),
           "finish_reason": "stop", "stop_id": 2, "shard": 0}
    seq = data.training_sequence(row, max_length=100)
    assert seq.input_ids == (1, 5, 6, 7, *range(10, 30), 2)
    assert seq.loss_mask() == [False] * 4 + [True] * 21 and seq.loss_tokens == 21
    cut = data.training_sequence({**row, "finish_reason": "length", "stop_id": None}, max_length=10)
    assert cut.input_ids == (1, 5, 6, 7, *range(10, 16)) and cut.loss_start == 4


def test_short_samples_are_dropped_and_sequences_end_with_the_stop_token(target, tmp_path):
    items = prompts.build_prompts(12, seed=2)
    spec = data.GenerationSpec("tiny", n=12, max_new_tokens=16, batch_size=4, shard_size=4, dtype="fp32")
    data.generate(target, items, tmp_path, spec, render=render)
    rows = {r["id"]: r for r in data.read_rows(tmp_path)}
    loss_tokens = {i: len(r["response_ids"]) + (r["finish_reason"] == "stop") for i, r in rows.items()}
    kept = data.load_sequences(tmp_path, min_loss_tokens=14)
    assert {s.id for s in kept} == {i for i, n in loss_tokens.items() if n >= 14}
    assert 0 < len(kept) < len(rows)  # this seed has both
    for seq in kept:
        row = rows[seq.id]
        assert list(seq.input_ids[: seq.loss_start]) == row["prompt_ids"]
        stop = [row["stop_id"]] if row["finish_reason"] == "stop" else []
        assert list(seq.input_ids[seq.loss_start :]) == row["response_ids"] + stop


# ---- features -------------------------------------------------------------------------------------------------
def test_feature_cache_round_trip_and_mismatches(target, tmp_path):
    seqs = sequences(5)
    manifest = features.write_cache(target, seqs, (1, 3), tmp_path, batch_size=2, shard_tokens=60)
    assert len(manifest["shards"]) > 1 and manifest["tokens"] == sum(len(s.input_ids) for s in seqs)
    assert manifest["bytes_per_token"] == (2 + 1) * 64 * 2 + 4
    cached = features.FeatureCache(tmp_path, target, (3,))(seqs[1:4])
    online = features.OnlineFeatures(target, (3,))(seqs[1:4])
    real = online.attention
    assert torch.equal(cached.input_ids, online.input_ids) and torch.equal(cached.loss_mask, online.loss_mask)
    assert torch.equal(cached.layers[real], online.layers[real].to(torch.bfloat16))
    assert torch.equal(cached.final[real], online.final[real].to(torch.bfloat16))
    with pytest.raises(features.FeatureCacheError, match="missing"):
        features.FeatureCache(tmp_path, target, (1, 2))
    with pytest.raises(features.FeatureCacheError, match="target"):
        features.FeatureCache(tmp_path, tiny_target("llama", seed=1), (1,))
    stale = data.TrainSequence(seqs[0].id, (5,) * len(seqs[0].input_ids), 3)
    with pytest.raises(features.FeatureCacheError, match="stale"):
        features.FeatureCache(tmp_path, target, (1,))([stale])


def test_feature_cache_resumes_bit_identical_after_a_crash_and_skips_a_complete_cache(target, tmp_path, monkeypatch):
    seqs = sequences(9)
    whole = features.write_cache(target, seqs, (1, 3), tmp_path / "whole", batch_size=2, shard_tokens=60)
    calls = []
    real_forward = features.target_features

    def crash_after(n):
        def forward(*args, **kwargs):
            calls.append(1)
            if len(calls) > n:
                raise KeyboardInterrupt  # the session ends mid-write
            return real_forward(*args, **kwargs)
        return forward

    monkeypatch.setattr(features, "target_features", crash_after(3))
    with pytest.raises(KeyboardInterrupt):
        features.write_cache(target, seqs, (1, 3), tmp_path / "cut", batch_size=2, shard_tokens=60)
    progress = json.loads((tmp_path / "cut" / features.PROGRESS).read_text())
    assert not (tmp_path / "cut" / features.MANIFEST).exists()
    assert 0 < progress["next"] < len(seqs) and progress["next"] % 2 == 0  # a batch boundary
    written = len(progress["shards"])
    assert 0 < written < len(whole["shards"])
    (tmp_path / "cut" / f"shard-{written:05d}.safetensors.tmp").write_bytes(b"torn")  # a half-written shard
    calls.clear()
    monkeypatch.setattr(features, "target_features", crash_after(100))
    reported = []
    resumed = features.write_cache(target, seqs, (1, 3), tmp_path / "cut", batch_size=2, shard_tokens=60,
                                   on_batch=reported.append)
    assert len(calls) == (len(seqs) - progress["next"] + 1) // 2  # only the batches after the last shard
    assert sum(reported) == whole["tokens"]
    assert {k: v for k, v in resumed.items() if k != "bytes"} == {k: v for k, v in whole.items() if k != "bytes"}
    for name in whole["shards"]:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == sorted([features.MANIFEST, *whole["shards"]])
    calls.clear()  # complete and unchanged: nothing is recomputed
    assert features.write_cache(target, seqs, (1, 3), tmp_path / "cut", batch_size=2, shard_tokens=60) == resumed
    assert calls == []
    other = features.write_cache(target, seqs, (1,), tmp_path / "cut", batch_size=2, shard_tokens=60)
    assert other["taps"] == [1] and len(calls) == (len(seqs) + 1) // 2  # other settings: written afresh
    assert set(other["shards"]) == {p.name for p in (tmp_path / "cut").glob("shard-*")}


def test_feature_cache_does_not_resume_other_sequences_or_source(target, tmp_path, monkeypatch):
    seqs = sequences(8)
    real_forward, calls = features.target_features, []
    limit = [2]

    def forward(*args, **kwargs):
        calls.append(1)
        if len(calls) > limit[0]:
            raise KeyboardInterrupt
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(features, "target_features", forward)
    changed = [*seqs[:-1], data.TrainSequence(seqs[-1].id, seqs[-1].input_ids[:-1], seqs[-1].loss_start)]
    for other in ({"seqs": changed}, {"seqs": seqs, "source": {"data_manifest_sha256": "another"}}):
        calls.clear()
        limit[0] = 2
        with pytest.raises(KeyboardInterrupt):
            features.write_cache(target, seqs, (1, 3), tmp_path, batch_size=2, shard_tokens=40)
        assert json.loads((tmp_path / features.PROGRESS).read_text())["next"] > 0
        calls.clear()
        limit[0] = 100
        manifest = features.write_cache(target, other["seqs"], (1, 3), tmp_path, batch_size=2, shard_tokens=40,
                                        source=other.get("source"))
        assert len(calls) == 4  # every batch again
        assert manifest["tokens"] == sum(len(s.input_ids) for s in other["seqs"])
        assert {p.name for p in tmp_path.glob("shard-*")} == set(manifest["shards"])


# ---- schedule and data order ----------------------------------------------------------------------------------
def test_lr_schedule_values():
    f = trainer.lr_factor
    assert [f(s, 100, 4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4, 100, 4) == 1.0 and f(52, 100, 4) == pytest.approx(0.5) and f(100, 100, 4) == pytest.approx(0.0)
    after = [f(s, 100, 4) for s in range(4, 100)]
    assert all(a > b for a, b in zip(after, after[1:], strict=False)) and after[-1] > 0
    assert trainer.TrainConfig("dspark", steps=250).warmup_steps == 10
    assert f(0, 10, 0) == 1.0


def test_batch_order_is_a_seeded_permutation_per_epoch():
    steps = [trainer.batch_indices(s, 10, 3, seed=7) for s in range(6)]
    assert steps == [trainer.batch_indices(s, 10, 3, seed=7) for s in range(6)]
    first, second = sum(steps[:3], []), sum(steps[3:], [])
    assert len(set(first)) == 9 and len(set(second)) == 9 and first != second


# ---- trainer ----------------------------------------------------------------------------------------------------
class StandIn(nn.Module):
    """A tiny trainable module with the drafter loss contract; its loss draws from the generator."""

    def __init__(self, target):
        super().__init__()
        self.target = target
        self.proj = nn.Linear(target.hidden_size, target.hidden_size)

    def loss(self, batch, generator: torch.Generator, keep: float = 0.7) -> LossOutput:
        drop = torch.rand(batch.input_ids.shape, generator=generator) >= keep
        mask = (batch.loss_mask & ~drop.to(batch.loss_mask.device))[:, 1:].float()
        logits = self.target.lm_head(self.proj(batch.layers[:, :, 0].float()))[:, :-1]
        ce = F.cross_entropy(logits.transpose(1, 2), batch.input_ids[:, 1:], reduction="none")
        loss = (ce * mask).sum() / mask.sum()
        q = torch.softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        accept = torch.stack([(q * mask).sum() / mask.sum(), (q * q * mask).sum() / mask.sum()]).detach()
        return LossOutput(loss, {"ce": float(loss.detach())}, accept)


def standin_method() -> methods.Method:
    from dspark_bench.drafters import checkpoint

    def build(target, options):
        module, g = StandIn(target), torch.Generator().manual_seed(options.seed)
        with torch.no_grad():
            module.proj.weight.copy_(torch.randn(module.proj.weight.shape, generator=g) * 0.05)
            module.proj.bias.zero_()
        return module.to(target.device)

    def save(module, folder):
        fp = checkpoint.TargetFingerprint.of(module.target)
        return checkpoint.save(folder, "standin", {}, module.state_dict(), fp)

    return methods.Method("standin", ("seed",), build, lambda t, o: (2,), lambda o: {"keep": 0.7}, save)


class Interrupt(Exception):
    pass


def _stop_at(step: int):
    def on_step(record):
        if record.step == step:
            raise Interrupt

    return on_step


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_resume_is_bit_exact(target, tmp_path):
    seqs, m = sequences(7), standin_method()
    config = trainer.TrainConfig("standin", steps=6, batch_size=3, save_every=3, lr=1e-2, warmup=2)
    source = features.OnlineFeatures(target, (2,))
    final = trainer.train(config, m, target, seqs, source, tmp_path / "a")
    with pytest.raises(Interrupt):
        trainer.train(config, m, target, seqs, source, tmp_path / "b", on_step=_stop_at(4))
    with pytest.raises(trainer.TrainError, match="--resume"):
        trainer.train(config, m, target, seqs, source, tmp_path / "b")
    with pytest.raises(trainer.TrainError, match="lr"):
        trainer.train(replace(config, lr=1.0), m, target, seqs, source, tmp_path / "b", resume=True)
    resumed = trainer.train(config, m, target, seqs, source, tmp_path / "b", resume=True)
    a, b = _weights(final), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = [[json.loads(line) for line in (tmp_path / d / "train_log.jsonl").read_text().splitlines()] for d in "ab"]
    assert [r["step"] for r in logs[1]] == list(range(1, 7))
    assert [(r["loss"], r["lr"]) for r in logs[0]] == [(r["loss"], r["lr"]) for r in logs[1]]
    assert [p.name for p in trainer.completed_checkpoints(tmp_path / "b")] == ["step-000003", "step-000006"]


def test_resume_with_nothing_to_resume_is_refused_unless_asked_to_start_afresh(target, tmp_path):
    seqs, m = sequences(7), standin_method()
    config = trainer.TrainConfig("standin", steps=4, batch_size=3, save_every=3, lr=1e-2, warmup=1)
    source = features.OnlineFeatures(target, (2,))
    with pytest.raises(trainer.TrainError, match="no training run to resume .* run without --resume"):
        trainer.train(config, m, target, seqs, source, tmp_path / "empty", resume=True)
    assert not (tmp_path / "empty").exists()
    with pytest.raises(Interrupt):  # stopped before its first checkpoint (step 3)
        trainer.train(config, m, target, seqs, source, tmp_path / "early", on_step=_stop_at(2))
    with pytest.raises(trainer.TrainError, match="no completed checkpoint .* delete .* without --resume"):
        trainer.train(config, m, target, seqs, source, tmp_path / "early", resume=True)
    fresh = trainer.train(config, m, target, seqs, source, tmp_path / "fresh")
    for name in ("early", "new"):  # "if-any": the run is started afresh, as a fresh run
        again = trainer.train(config, m, target, seqs, source, tmp_path / name, resume=trainer.RESUME_IF_ANY)
        a, b = _weights(fresh), _weights(again)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert trainer.resume_point(tmp_path / "new").name == "step-000004"


def test_cli_refuses_a_resume_with_nothing_to_resume_and_a_vocabulary_of_no_tokens(tmp_path):
    from click.testing import CliRunner

    from dspark_bench.cli.train import cli

    runner = CliRunner()
    for args, says in ((["train", "--method", "dspark", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                         "--resume"], "holds no training run to resume"),
                       (["data", "vocab", "--data", str(tmp_path / "d"), "--size", "0"], "0 is not in the range x>=1"),
                       (["data", "vocab", "--data", str(tmp_path / "d"), "--coverage", "8,-1"],
                        "expected a comma list of positive integers")):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_init_from_starts_a_new_run_from_a_checkpoints_weights_and_refuses_one_that_does_not_fit(target, tmp_path):
    from dspark_bench.drafters.vocab import STATE_KEY, vocab_for

    seqs = sequences(6, seed=2)
    options = methods.MethodOptions(num_anchors=8, markov_rank=8, draft_vocab=40)
    m = methods.method("dspark")
    source = features.OnlineFeatures(target, m.taps(target, options))
    base = trainer.TrainConfig("dspark", steps=3, batch_size=3, lr=3e-3, warmup=1, save_every=100, options=options)
    first = trainer.train(base, m, target, seqs, source, tmp_path / "first")
    start = trainer.init_source(first)
    assert start["folder"] == str(first) and len(start["model_sha256"]) == 64

    # the module starts from exactly the checkpoint's weights, not fresh ones
    init = replace(base, lr=1e-12, warmup=0, init_from=start)
    module = trainer.Trainer(init, m, target, seqs, source, tmp_path / "x").module
    fresh = {k: v.clone() for k, v in module.state_dict().items()}
    built = trainer.Trainer(init, m, target, seqs, source, tmp_path / "y")
    built.initialise(start)
    saved = _weights(first)
    assert all(torch.equal(built.module.state_dict()[k].cpu(), saved[k]) for k in saved)
    assert any(not torch.equal(fresh[k].cpu(), saved[k]) for k in saved)
    # train() does the same at step 0 (a learning rate of 1e-12 leaves the weights where they started)
    second = trainer.train(replace(init, steps=1), m, target, seqs, source, tmp_path / "second")
    after = _weights(second)
    assert all(torch.allclose(after[k].float(), saved[k].float(), atol=1e-6) for k in saved)
    assert json.loads((tmp_path / "second" / "train_config.json").read_text())["init_from"] == start
    with pytest.raises(trainer.TrainError, match="init_from"):  # resuming with another start is refused
        trainer.train(replace(init, steps=1, init_from=None), m, target, seqs, source, tmp_path / "second",
                      resume=True)

    with pytest.raises(trainer.TrainError, match="holds a 'dspark' drafter; --init-from needs 'dflash'"):
        trainer.Trainer(replace(base, method="dflash"), methods.method("dflash"), target, seqs, source,
                        tmp_path / "z").initialise(start)
    with pytest.raises(trainer.TrainError, match="architecture differs in num_layers"):
        trainer.Trainer(replace(base, options=replace(options, num_layers=2)), m, target, seqs, source,
                        tmp_path / "z").initialise(start)
    with pytest.raises(trainer.TrainError, match="it drafts over 40 tokens, this run over 24 tokens"):
        trainer.Trainer(replace(base, options=replace(options, draft_vocab=24)), m, target, seqs, source,
                        tmp_path / "z").initialise(start)
    with pytest.raises(trainer.TrainError, match="this run over the full vocabulary"):
        trainer.Trainer(replace(base, options=replace(options, draft_vocab=0)), m, target, seqs, source,
                        tmp_path / "z").initialise(start)
    # other data ranks other tokens first: the run keeps the checkpoint's list (its rows are what it learnt)
    other = sequences(6, seed=11, lo=30, hi=36)
    assert not torch.equal(vocab_for(target, other, 40), vocab_for(target, seqs, 40))
    moved = trainer.train(replace(init, steps=1), m, target, other, source, tmp_path / "other")
    assert torch.equal(_weights(moved)[STATE_KEY], saved[STATE_KEY])
    with pytest.raises(trainer.TrainError, match="not a drafter checkpoint"):
        trainer.init_source(tmp_path)
    with (first / "model.safetensors").open("ab") as f:  # the checkpoint changed after the run recorded it
        f.write(b"\0")
    with pytest.raises(trainer.TrainError, match="changed since this run was started"):
        built.initialise(start)


@pytest.mark.parametrize("name", ["dspark", "dflash", "eagle3", "mtp"])
def test_each_method_lowers_its_loss(target, tmp_path, name):
    from dspark_bench.drafters import registry

    m = methods.method(name)
    options = methods.MethodOptions(num_anchors=16, markov_rank=16)
    seqs = sequences(4, seed=1)
    config = trainer.TrainConfig(name, steps=12, batch_size=4, lr=3e-3, warmup=1, save_every=100, options=options)
    records = []
    final = trainer.train(config, m, target, seqs, features.OnlineFeatures(target, m.taps(target, options)),
                          tmp_path, on_step=records.append)
    losses = [r.loss for r in records]
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    assert all(0 <= a <= 1 for r in records for a in r.acceptance)
    drafter = registry.create(name, target, {"checkpoint": str(final)})  # loadable by the engine's drafter
    assert drafter.feature_layers


# ---- command line ---------------------------------------------------------------------------------------------
def test_cli_prompts_and_clear_errors(tmp_path):
    from click.testing import CliRunner

    from dspark_bench.cli.train import cli

    runner = CliRunner()
    out = tmp_path / "prompts.jsonl"
    result = runner.invoke(cli, ["data", "prompts", "--n", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 20
    result = runner.invoke(cli, ["train", "--method", "dspark", "--data", str(tmp_path / "none"), "--out",
                                 str(tmp_path / "run")])
    assert result.exit_code == 2 and "training-data folder" in " ".join(result.output.split())
    result = runner.invoke(cli, ["train", "--method", "dspark", "--data", str(tmp_path / "none"), "--out",
                                 str(tmp_path / "run"), "--init-from", str(tmp_path)])
    assert result.exit_code == 2 and "not a drafter checkpoint" in " ".join(result.output.split())


def test_resume_accepts_the_same_data_folder_spelled_differently():
    """'./data/x' and 'data/x' are one folder: a resume must not refuse it; another folder still differs."""
    a = {"lr": 1, "data": {"folder": "./data/x", "features": "data/x/features", "manifest_sha256": "h"}}
    b = {"lr": 1, "data": {"folder": "data/x", "features": "./data/x/features", "manifest_sha256": "h"}}
    assert trainer._comparable(a) == trainer._comparable(b)
    assert trainer._comparable(a) != trainer._comparable({**b, "data": {**b["data"], "folder": "data/y"}})
    assert trainer._comparable({"data": {"features": "online"}})["data"]["features"] == "online"


def test_resume_fills_in_method_options_added_after_the_run_was_recorded():
    """A run recorded before ``markov_head`` existed used the vanilla head: resuming it must not be refused."""
    from dataclasses import asdict

    now = {"options": asdict(methods.MethodOptions())}
    old = {"options": {k: v for k, v in now["options"].items() if k != "markov_head"}}
    assert trainer._comparable(old) == trainer._comparable(now)
    rnn = {"options": {**now["options"], "markov_head": "rnn"}}
    assert trainer._comparable(old) != trainer._comparable(rnn)


def test_markov_head_option_builds_that_head(target):
    rnn = methods.method("dspark").build(target, methods.MethodOptions(markov_rank=8, markov_head="rnn"))
    assert rnn.arch.markov_head_type == "rnn" and rnn.markov_head.kind == "rnn"
    assert methods.method("dspark").used(methods.MethodOptions(markov_head="rnn"))["markov_head"] == "rnn"
    with pytest.raises(ValueError, match="markov head 'lstm' is not one of vanilla, gated, rnn"):
        methods.MethodOptions(markov_head="lstm")
    from dspark_bench.cli.train import train
    from dspark_bench.drafters.blockdraft import MARKOV_HEAD_TYPES

    choice = next(p for p in train.params if p.name == "markov_head").type
    assert tuple(choice.choices) == MARKOV_HEAD_TYPES  # the CLI's list (kept import-free) matches the model's


# ---- held-out scoring -----------------------------------------------------------------------------------------
def test_heldout_score_of_mtp_is_the_exact_acceptance_over_every_position(target):
    """MTP scores every response position: the held-out alpha* is the hand-computed sum_v min(q_v, p_v) of the
    full target law at each slot, averaged per batch, not the acceptance conditional on the list."""
    from dspark_bench.drafters import vocab
    from dspark_bench.train import heldout

    m, options = methods.method("mtp"), methods.MethodOptions()
    module = m.build(target, options)
    seqs = sequences(3, seed=4)
    module.set_draft_vocab(vocab.vocab_for(target, seqs, 30))
    source = features.OnlineFeatures(target, m.taps(target, options))
    held = heldout.HeldOut(seqs, source, batch_size=8)
    got = held.score(module, m.loss_kwargs(options))
    batch = source(sorted(seqs, key=lambda s: (len(s.input_ids), s.id)))
    from dspark_bench.drafters.chain import shift_left, ttt_mask

    with torch.no_grad():
        b, n = batch.input_ids.shape
        positions = torch.arange(n).expand(b, n)
        out, _ = module(module.context(batch.layers, batch.final), shift_left(batch.input_ids, 1), positions, None,
                        ttt_mask(batch.attention, 0))
        q = torch.softmax(module.logits(out, compact=True), -1)
        p = torch.softmax(target.model.lm_head(batch.final).float(), -1)[..., module.draft_head.ids]
        alpha = torch.minimum(q, shift_left(p, 1)).sum(-1)
        valid = shift_left(batch.loss_mask, 2).float()
        want = float((alpha * valid).sum() / valid.sum())
    assert got.acceptance == [pytest.approx(want, abs=1e-5)] and got.tau == pytest.approx(1 + want, abs=1e-5)
    assert got.sequences == 3 and got.tokens == sum(s.loss_tokens for s in seqs)
    assert module.training and held.score(module, {}) == got  # deterministic, and the module's mode is restored
    with pytest.raises(trainer.TrainError, match="empty"):
        heldout.HeldOut([], source)


def test_heldout_scoring_during_training_changes_nothing_but_the_log(target, tmp_path):
    """Scored every 3 steps and at the last: identical weights and training log to a run without it; the
    score comes back from a resume; a checkpoint loaded by load_module scores as the module it was saved from."""
    from dspark_bench.train import heldout

    m = methods.method("dspark")
    options = methods.MethodOptions(num_anchors=8, markov_rank=8, draft_vocab=40)
    seqs, other = sequences(6, seed=2), sequences(4, seed=9)
    source = features.OnlineFeatures(target, m.taps(target, options))
    config = trainer.TrainConfig("dspark", steps=7, batch_size=3, lr=3e-3, warmup=1, save_every=2, options=options)
    held = heldout.HeldOut(other, source)
    plain = trainer.train(config, m, target, seqs, source, tmp_path / "plain")
    scored = trainer.train(config, m, target, seqs, source, tmp_path / "scored", heldout=held, heldout_every=3)
    a, b = _weights(plain), _weights(scored)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = {d: [json.loads(x) for x in (tmp_path / d / "train_log.jsonl").read_text().splitlines()]
            for d in ("plain", "scored")}
    assert [r["step"] for r in logs["scored"] if r["heldout"]] == [3, 6, 7]
    clocks = ("seconds", "tokens_per_s", "heldout")
    assert [{k: v for k, v in r.items() if k not in clocks} for r in logs["scored"]] == \
        [{k: v for k, v in r.items() if k not in clocks} for r in logs["plain"]]
    assert not any(r["heldout"] for r in logs["plain"])
    last = logs["scored"][-1]["heldout"]
    assert len(last["acceptance"]) == 7 and last["sequences"] == 4 and 1 <= last["tau"] <= 8
    _, _, loaded = heldout.load_module(scored, target, num_anchors=8)
    assert held.score(loaded, m.loss_kwargs(options)).to_json() == last
    with pytest.raises(Interrupt):
        trainer.train(config, m, target, seqs, source, tmp_path / "again", heldout=held, heldout_every=3,
                      on_step=_stop_at(4))
    trainer.train(config, m, target, seqs, source, tmp_path / "again", resume=True, heldout=held, heldout_every=3)
    again = [json.loads(x) for x in (tmp_path / "again" / "train_log.jsonl").read_text().splitlines()]
    assert [r["heldout"] for r in again] == [r["heldout"] for r in logs["scored"]]
    with pytest.raises(trainer.TrainError, match="heldout_every"):
        trainer.train(config, m, target, seqs, source, tmp_path / "bad", heldout=held)


def test_cli_data_score_scores_checkpoints_on_held_out_sequences(target, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dspark_bench.cli import train as train_cli
    from dspark_bench.train import heldout

    spec = data.GenerationSpec("tiny", n=6, seed=5, max_new_tokens=24, batch_size=3, shard_size=3, dtype="fp32")
    folder, other = tmp_path / "held", tmp_path / "train"
    data.generate(target, prompts.build_prompts(6, seed=5), folder, spec, render=render)
    data.generate(target, prompts.build_prompts(3, seed=5), other, replace(spec, n=3), render=render)
    m, options = methods.method("mtp"), methods.MethodOptions(draft_vocab=30)
    config = trainer.TrainConfig("mtp", steps=2, batch_size=2, lr=3e-3, warmup=1, save_every=100, options=options)
    source = features.OnlineFeatures(target, ())
    ckpt = trainer.train(config, m, target, sequences(4), source, tmp_path / "run")
    monkeypatch.setattr(train_cli, "_load_target", lambda name, dtype, device: target)
    runner = CliRunner()
    out = tmp_path / "score.json"
    args = ["data", "score", "--drafter", str(ckpt), "--data", str(folder), "--json", str(out), "--threads", "1"]
    result = runner.invoke(train_cli.cli, args)
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    seqs = data.load_sequences(folder)
    want = heldout.HeldOut(seqs, source).score(heldout.load_module(ckpt, target)[2], {})
    assert got["n"] == len(seqs) and got["scores"][str(ckpt)] == {"method": "mtp", **want.to_json()}
    assert "tau" in result.output
    # build_prompts(3) is a part of build_prompts(6): 3 training prompts, counted before they are generated
    (other / data.RESPONSES).write_text((other / data.RESPONSES).read_text().splitlines(keepends=True)[0])
    result = runner.invoke(train_cli.cli, [*args, "--exclude", str(other)])
    assert result.exit_code == 0, result.output
    shared = {p.text for p in prompts.build_prompts(3, seed=5)}
    rows = data.read_rows(folder)
    assert json.loads(out.read_text())["dropped"] == 3 == sum(r["prompt"] in shared for r in rows)
    shared_ids = {r["id"] for r in rows if r["prompt"] in shared}
    assert json.loads(out.read_text())["n"] == sum(s.id not in shared_ids for s in seqs) < len(seqs)
    result = runner.invoke(train_cli.cli, [*args, "--n", "0"])
    assert result.exit_code == 2 and "--n" in result.output
    # --draft-vocab: the same module scored over another list; the checkpoint's own list as a file changes nothing
    module = heldout.load_module(ckpt, target)[2]
    own = vocab.write_vocab(tmp_path / "own.json", module.draft_vocab.cpu(), {})
    full_args = [*args, "--draft-vocab"]
    result = runner.invoke(train_cli.cli, [*full_args, str(own)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["scores"][str(ckpt)] == {"method": "mtp", **want.to_json()}
    result = runner.invoke(train_cli.cli, [*full_args, "full"])
    assert result.exit_code == 0, result.output
    module.set_draft_vocab(None)
    full = heldout.HeldOut(seqs, source).score(module, {})
    got = json.loads(out.read_text())
    assert got["draft_vocab"] == "full" and got["scores"][str(ckpt)] == {"method": "mtp", **full.to_json()}
    assert full.acceptance != want.acceptance  # the list of 30 tokens leaves out most of the target's mass
    result = runner.invoke(train_cli.cli, [*full_args, str(tmp_path / "nowhere.json")])
    assert result.exit_code == 2 and "--draft-vocab" in result.output and "nowhere.json" in result.output
    result = runner.invoke(train_cli.cli, ["data", "score", "--drafter", str(tmp_path / "run"), "--data", str(folder)])
    assert result.exit_code == 2 and "--drafter" in result.output and "not a drafter checkpoint" in result.output
    empty = tmp_path / "empty"  # generation started, no shard complete yet
    data.generate(target, prompts.build_prompts(3, seed=5), empty, replace(spec, n=3), render=render, max_shards=0)
    result = runner.invoke(train_cli.cli, ["data", "score", "--drafter", str(ckpt), "--data", str(empty)])
    assert result.exit_code == 2 and "no usable sequence" in result.output
    odd = tmp_path / "odd"  # prompts that are not build_prompts(n, seed) of its spec: they cannot be listed
    data.generate(target, prompts.build_prompts(3, seed=1), odd, replace(spec, n=3), render=render)
    with pytest.raises(data.DataError, match="cannot be listed"):
        heldout.planned_prompts(odd)


def test_gpu_reference_script_refuses_bad_input_before_any_work(tmp_path):
    """recipes/gpu_reference.sh names an unknown method and exits 2 before it loads anything."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "METHODS": "dspark medusa"}
    done = subprocess.run(["bash", str(root / "recipes" / "gpu_reference.sh"), str(tmp_path / "out")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown method medusa" in done.stderr
    assert not (tmp_path / "out").exists()


def test_gpu_reference_script_runs_every_stage_on_cpu_at_tiny_settings(tmp_path):
    """recipes/gpu_reference.sh at tiny settings on the CPU: both runs of two methods on the committed data, the
    shipped layout and the held-out scores beside the shipped drafters."""
    import os
    import subprocess
    import sys

    from dspark_bench.target.model import default_cache_dir

    if not (default_cache_dir() / "smollm2-135m-instruct" / "model.safetensors").exists():
        pytest.skip("the embedded target's converted checkpoint is not in the cache (run any smollm2 command once)")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(root), "METHODS": "dspark mtp", "STEPS1": "2",
           "STEPS2": "2", "BATCH": "2", "MICRO": "2", "DEVICE": "cpu", "HELDOUT_N": "2", "DEADLINE": "0"}
    done = subprocess.run(["bash", str(root / "recipes" / "gpu_reference.sh"), str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    logs = "".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("*.log")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs
    for m in ("dspark", "mtp"):
        second = [json.loads(line) for line in (out / "runs" / f"{m}-2" / "train_log.jsonl").read_text().splitlines()]
        assert second[-1]["step"] == 2
        cfg = json.loads((out / "runs" / f"{m}-2" / "train_config.json").read_text())
        assert cfg["init_from"]["folder"].endswith(f"{m}-1/final") and cfg["lr"] == pytest.approx(3e-4)
        assert (out / "smollm2-135m" / m / "model.safetensors").is_file()
    scores = json.loads((out / "heldout-t1.json").read_text())
    assert len(scores["scores"]) == 4 and scores["n"] == 2  # the shipped and the new checkpoint of each method

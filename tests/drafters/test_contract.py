"""Contract every registered drafter must meet, without editing this file: at temperature 0 its output is
token-identical to vanilla decoding (``none``), alone and batched, on Llama- and Qwen3-style targets; and under the
sampling filters its draft law q is processed as the target's p is (what it drafts from ``DraftContext.sampling``).

Random-weight drafters almost never agree with the target, so that alone would only test the rounds where the
first draft token is rejected. So every model drafter (one that loads a ``checkpoint``) is also trained, through
its training method (``train.methods``), on the very sequences the test decodes until it agrees with the target
often, and must then still be token-identical while rounds accept three or more draft tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop

TARGETS = {arch: tiny_target(arch) for arch in ("llama", "qwen3")}
BLOCK = 5
NEW_TOKENS = 24
STEPS, LR = 100, 1e-2  # enough for every method to memorise 3 sequences of 24 tokens (rounds of 3+ accepted)
LENGTH_CAPS = ("depth",)  # options that cap a proposal below the block (MTP-k): set to the block size here


def _requests():
    return [Request(i, tuple(p), 11 + i) for i, p in enumerate(random_prompts(3, seed=21))]


def _decode(target, drafter, concurrency):
    results = []
    engine = RoundLoop(target, drafter, EngineConfig(max_new_tokens=NEW_TOKENS, temperature=0.0, block_size=BLOCK,
                                                  concurrency=concurrency))
    engine.run(_requests(), results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return results


def _outputs(results):
    return {r.request.request_id: r.output_ids for r in results}


def _greedy(target, name, concurrency):
    return _outputs(_decode(target, drafters.create(name, target), concurrency))


def _model_drafters() -> list[str]:
    return [n for n in drafters.names()
            if "checkpoint" in {f.name for f in dataclasses.fields(drafters.drafter_class(n).Config)}]


@pytest.mark.parametrize("arch", sorted(TARGETS))
@pytest.mark.parametrize("name", drafters.names())
def test_greedy_identical_to_none(name, arch):
    target = TARGETS[arch]
    reference = _greedy(target, "none", 1)
    assert _greedy(target, name, 1) == reference
    assert _greedy(target, name, 3) == reference


def _padded_batch(target, results, taps):
    """The decoded sequences (prompt + greedy output) as a right-padded TrainBatch with their target features."""
    from dspark_bench.drafters.types import TrainBatch

    rows = sorted(results, key=lambda r: r.request.request_id)
    seqs = [list(r.request.prompt_ids) + list(r.output_ids) for r in rows]
    b, n = len(seqs), max(map(len, seqs))
    ids, attention, loss_mask = (torch.zeros(b, n, dtype=torch.long), torch.zeros(b, n, dtype=torch.bool),
                                 torch.zeros(b, n, dtype=torch.bool))
    layers, final = torch.zeros(b, n, len(taps), target.hidden_size), torch.zeros(b, n, target.hidden_size)
    _, out = target.prefill(seqs, taps)
    for i, (seq, row) in enumerate(zip(seqs, rows, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = True
        loss_mask[i, len(row.request.prompt_ids): len(seq)] = True
        if taps:
            layers[i, : len(seq)] = out.features[i].layers.float()
        final[i, : len(seq)] = out.features[i].final.float()
    return TrainBatch(ids, loss_mask, attention, layers, final)


def _agreeing(target, name, folder):
    """Drafter ``name`` trained with its own method on the sequences the test decodes, loaded from a checkpoint."""
    from dspark_bench.train.methods import METHODS, MethodOptions

    assert name in METHODS, (f"drafter {name!r} loads checkpoints but has no training method in train.methods, "
                             f"so the contract cannot give it weights that agree with the target")
    method = METHODS[name]
    options = MethodOptions(num_layers=1, block_size=BLOCK, num_anchors=16, ttt_length=BLOCK, seed=0)
    module = method.build(target, options)
    batch = _padded_batch(target, _decode(target, drafters.create("none", target), 1), method.taps(target, options))
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=LR)
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        loss = module.loss(batch, generator, **method.loss_kwargs(options)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    saved = method.save(module, folder / name)
    fields = {f.name for f in dataclasses.fields(drafters.drafter_class(name).Config)}
    options = {"checkpoint": str(saved), **{k: BLOCK for k in LENGTH_CAPS if k in fields}}
    return drafters.create(name, target, options)


@pytest.mark.parametrize("arch", sorted(TARGETS))
@pytest.mark.parametrize("name", _model_drafters())
def test_greedy_identical_to_none_while_drafts_are_accepted(name, arch, tmp_path):
    target = TARGETS[arch]
    drafter = _agreeing(target, name, tmp_path)
    reference = _outputs(_decode(target, drafters.create("none", target), 1))
    accepted = []
    for concurrency in (1, 3):
        results = _decode(target, drafter, concurrency)
        assert _outputs(results) == reference, f"{name} at concurrency {concurrency}"
        accepted += [r.accepted for res in results for r in res.rounds]
    long_rounds = sum(a >= 3 for a in accepted)
    assert long_rounds >= 3, f"{name}: only {long_rounds} of {len(accepted)} rounds accepted 3+ draft tokens"


def test_every_model_drafter_is_covered():
    """The agreeing-drafter check covers each registered drafter that loads a checkpoint (a new one included)."""
    from dspark_bench.train.methods import METHODS

    names = _model_drafters()
    assert {"dspark", "dflash", "eagle3", "mtp"} <= set(names)
    assert not [n for n in names if n not in METHODS]


def _kept(proposal):
    """A proposal whose draft laws outlive the round: the engine's drafters write q into memory it reuses."""
    return proposal if proposal.q is None else dataclasses.replace(proposal, q=proposal.q.clone())


@pytest.mark.parametrize("name", drafters.names())
def test_draft_laws_follow_the_runs_sampling_filters(name):
    """With top-k 3 and min-p, every q a drafter hands over keeps at most 3 tokens, sums to 1 and gives its own
    draft token mass: the drafter drew from the filtered law (``ctx.sampling``), not from the temperature alone.
    Deterministic drafters (q = None) have nothing to filter."""
    target = TARGETS["llama"]
    drafter, seen = drafters.create(name, target), []
    propose = drafter.propose
    drafter.propose = lambda ctx: seen.append(_kept(propose(ctx))) or seen[-1]
    config = EngineConfig(max_new_tokens=12, temperature=1.3, block_size=BLOCK, concurrency=2, top_k=3, min_p=0.01)
    results = []
    RoundLoop(target, drafter, config).run(_requests()[:2], results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    rows = [(p.q[r, j], int(p.tokens[r, j])) for p in seen if p.q is not None
            for r in range(len(p.lengths)) for j in range(int(p.lengths[r]))]
    if all(p.q is None for p in seen):
        return  # deterministic drafts (none, n-gram)
    assert len(rows) >= 10, f"{name} drafted {len(rows)} tokens with a q"
    for q, token in rows:
        assert int((q > 0).sum()) <= 3 and float(q.sum()) == pytest.approx(1.0, abs=1e-5) and q[token] > 0

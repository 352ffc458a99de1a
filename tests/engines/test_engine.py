"""The engine on tiny random-weight targets: batching invariance, budgets, errors, incremental records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import TINY_EOS, random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.drafters.base import Drafter, Proposal
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop


def _requests(n=4, seed=0):
    return [Request(i, tuple(p), 100 + i, "synthetic", "custom", f"p{i}") for i, p in enumerate(random_prompts(n, seed=seed))]


def _run(target, name, reqs, **cfg):
    results = []
    RoundLoop(target, drafters.create(name, target), EngineConfig(**cfg)).run(reqs, results.append)
    return {r.request.request_id: r for r in results}


@pytest.mark.parametrize(("arch", "path"), [("llama", "auto"), ("qwen3", "auto"), ("qwen3", "hf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", ["none", "ngram"])
def test_batched_equals_alone(arch, path, temperature, name):
    """R = 4 gives each request the same output as running it alone (fp32, counter-based draws), on the fast
    forward and on transformers' own."""
    target = tiny_target(arch, forward_path=path)
    reqs = _requests(4)
    together = _run(target, name, reqs, max_new_tokens=40, temperature=temperature, concurrency=4)
    for req in reqs:
        alone = _run(target, name, [req], max_new_tokens=40, temperature=temperature, concurrency=1)
        assert alone[req.request_id].output_ids == together[req.request_id].output_ids


def test_concurrency_smaller_than_requests_refills(tiny):
    reqs = _requests(5, seed=3)
    out = _run(tiny, "ngram", reqs, max_new_tokens=30, temperature=1.0, concurrency=2)
    ref = _run(tiny, "ngram", reqs, max_new_tokens=30, temperature=1.0, concurrency=1)
    assert sorted(out) == [0, 1, 2, 3, 4]
    assert all(out[i].output_ids == ref[i].output_ids for i in out)
    assert max(r.batch for res in out.values() for r in res.rounds) == 2


def test_budget_and_round_accounting(tiny):
    res = _run(tiny, "ngram", _requests(3, seed=5), max_new_tokens=25, temperature=0.0, block_size=4)
    for r in res.values():
        assert r.status == "ok" and len(r.output_ids) <= 25
        assert r.finish == ("eos" if r.output_ids[-1] == TINY_EOS else "length")
        # the first token comes from prefill; every round commits what it says
        assert 1 + sum(x.committed for x in r.rounds) == len(r.output_ids)
        for x in r.rounds:
            assert 0 <= x.accepted <= x.verified <= x.proposed <= 4
            assert x.committed in (x.accepted, x.accepted + 1)


def test_vanilla_rounds_are_single_steps(tiny):
    res = _run(tiny, "none", _requests(2), max_new_tokens=12, temperature=1.0)
    for r in res.values():
        assert all((x.proposed, x.verified, x.accepted, x.committed) == (0, 0, 0, 1) for x in r.rounds)


class _Exploding(Drafter):
    name = "exploding"

    @dataclass(frozen=True)
    class Config:
        after: int = 3

    def __init__(self, config, target):
        super().__init__(config, target)
        self.calls = 0

    def propose(self, ctx):
        self.calls += 1
        if self.calls > self.config.after:
            raise RuntimeError("drafter blew up")
        return Proposal.empty(len(ctx.slots))


def test_failing_request_is_recorded_and_run_continues(tiny):
    drafter = _Exploding(_Exploding.Config(after=3), tiny)
    results = []
    reqs = _requests(2)
    RoundLoop(tiny, drafter, EngineConfig(max_new_tokens=10, temperature=1.0)).run(reqs, results.append)
    assert [r.status for r in results] == ["error", "error"]
    assert "drafter blew up" in results[0].error
    assert len(results[0].output_ids) == 4  # first token + 3 good rounds are kept, never dropped


def test_prefill_failure_is_recorded(tiny):
    bad = Request(0, (), 1)  # empty prompt
    good = _requests(1)[0]
    results = []
    RoundLoop(tiny, drafters.create("none", tiny), EngineConfig(max_new_tokens=5)).run([bad], results.append)
    RoundLoop(tiny, drafters.create("none", tiny), EngineConfig(max_new_tokens=5)).run([good], results.append)
    assert results[0].status == "error" and "empty" in results[0].error
    assert results[1].status == "ok"


@pytest.mark.parametrize("field, value", [("block_size", 0), ("temperature", -0.5), ("max_new_tokens", 0),
                                          ("concurrency", 0), ("top_p", 0.0), ("top_k", -2), ("min_p", 1.0)])
def test_engine_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("name", ["none", "ngram", "dflash"])
def test_top_k_1_decodes_greedily(tiny, name):
    """Top-k 1 at any temperature is greedy decoding, token for token, through the whole loop (p and q alike)."""
    reqs = _requests(3, seed=9)
    greedy = _run(tiny, name, reqs, max_new_tokens=20, temperature=0.0, concurrency=3)
    for temperature in (0.7, 1.5):
        top1 = _run(tiny, name, reqs, max_new_tokens=20, temperature=temperature, top_k=1, concurrency=3)
        assert {i: r.output_ids for i, r in top1.items()} == {i: r.output_ids for i, r in greedy.items()}


def test_target_cache_rollback_matches_full_forward(tiny):
    """After keep() the cached continuation equals a fresh forward over the committed sequence."""
    prompt = random_prompts(1, seed=9)[0]
    batch, _ = tiny.prefill([prompt])
    tiny.forward_block(batch, torch.tensor([[5, 6, 7, 8]]), [4])
    tiny.keep(batch, [2])  # keep 5, 6; 7 and 8 are rolled back
    out = tiny.forward_block(batch, torch.tensor([[9, 10]]), [2])
    with torch.no_grad():
        ref = tiny.model(torch.tensor([prompt + [5, 6, 9, 10]])).logits[0, -2:]
    assert torch.allclose(out.logits[0, :2], ref, atol=1e-4)
    assert batch.columns == len(prompt) + 4


def test_prefill_returns_last_logits_and_tapped_layers_only(tiny):
    """Prefill: logits at the last prompt position only; features of the tapped layers only, equal to HF's
    hidden states of those layers."""
    prompts = random_prompts(2, seed=4)
    batch, out = tiny.prefill(prompts, (1, 3))
    assert out.logits.shape == (2, 1, tiny.vocab_size)
    for r, p in enumerate(prompts):
        with torch.no_grad():
            ref = tiny.model(torch.tensor([p]), output_hidden_states=True)
        assert torch.allclose(out.logits[r, 0], ref.logits[0, -1], atol=1e-4)
        f = out.features[r]
        assert f.layers.shape == (len(p), 2, tiny.hidden_size)
        assert torch.allclose(f.layers[:, 0], ref.hidden_states[2][0], atol=1e-4)
        assert torch.allclose(f.layers[:, 1], ref.hidden_states[4][0], atol=1e-4)
    assert batch.lens == [len(p) for p in prompts]


def test_prompts_of_other_lengths_prefill_apart_and_come_back_in_order(tiny):
    """prefill_groups keeps prompts of similar lengths together (longest first) and splits the rest; the prefill
    (the fast path's end to end, and the HF path's grouped one) gives every row, in the order given, the logits,
    features, mask and positions of one padded forward over all of them, and the next block forward agrees too."""
    from dspark_bench.target.model import prefill_groups

    assert prefill_groups([117, 90, 122, 277, 208, 172, 61, 79]) == [[3], [4, 5], [2, 0, 1], [7], [6]]
    assert prefill_groups([5, 5, 5]) == [[0, 1, 2]] and prefill_groups([4]) == [[0]]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (3, 21, 20, 8, 21)]
    assert len(prefill_groups([len(p) for p in prompts])) == 3
    assert tiny.forward_path == "fast"
    together, t_out = tiny._prefill_padded(prompts, (1,))
    mask, next_pos = together.mask.copy(), together.next_pos.clone()
    ids = torch.randint(3, 90, (5, 2), generator=gen)
    tiny.keep(together, [len(p) for p in prompts])
    after = tiny.forward_block(together, ids, [2] * 5)
    for prefill in (tiny.prefill, tiny._prefill_grouped):
        grouped, g_out = prefill(prompts, (1,))
        assert torch.allclose(g_out.logits, t_out.logits, atol=1e-4)
        for g, t in zip(g_out.features, t_out.features, strict=True):
            assert torch.allclose(g.layers, t.layers, atol=1e-4) and torch.allclose(g.final, t.final, atol=1e-4)
        assert np.array_equal(grouped.mask, mask) and grouped.lens == [len(p) for p in prompts]
        assert torch.equal(grouped.next_pos, next_pos) and grouped.block_lens == [len(p) for p in prompts]
        tiny.keep(grouped, [len(p) for p in prompts])
        assert torch.allclose(tiny.forward_block(grouped, ids, [2] * 5).logits, after.logits, atol=1e-4)


def test_compaction_keeps_the_cached_continuation(tiny):
    """Holes reclaimed by compact() leave every row's next logits unchanged (RoPE positions are per row)."""
    prompts = random_prompts(3, seed=12)
    batch, _ = tiny.prefill(prompts)
    tiny.forward_block(batch, torch.tensor([[5, 6, 7, 8]] * 3), [4, 4, 4])
    tiny.keep(batch, [1, 3, 2])
    ids, lengths = torch.tensor([[9, 10], [11, 12], [13, 14]]), [2, 2, 2]
    import copy

    twin = copy.deepcopy(batch)
    tiny.compact(twin, 0)
    assert twin.columns == max(twin.lens) < batch.columns
    a, b = tiny.forward_block(batch, ids, lengths), tiny.forward_block(twin, ids, lengths)
    assert torch.allclose(a.logits, b.logits, atol=1e-4)


def test_cache_stays_within_longest_live_row_plus_a_block(tiny, monkeypatch):
    """64 prompts at concurrency 4: after every compaction the cache is at most the longest live row plus one
    block wide (block_size + 1 columns), and finished rows' columns do not accumulate."""
    block = 4
    seen = []
    compact = type(tiny).compact

    def watched(self, batch, slack):
        compact(self, batch, slack)
        seen.append((batch.columns, max(batch.lens, default=0), slack))

    monkeypatch.setattr(type(tiny), "compact", watched)
    reqs = [Request(i, tuple(p), 300 + i) for i, p in enumerate(random_prompts(64, seed=8))]
    res = _run(tiny, "ngram", reqs, max_new_tokens=24, temperature=1.0, block_size=block, concurrency=4)
    assert len(res) == 64 and all(r.status == "ok" for r in res.values())
    assert len(seen) > 64 and all(slack == block + 1 for *_, slack in seen)
    assert all(cols <= longest + block + 1 for cols, longest, _ in seen), max(c - n for c, n, _ in seen)
    longest_ever = max(len(r.prompt_ids) for r in reqs) + 24
    assert max(x.cache_columns for r in res.values() for x in r.rounds) <= longest_ever + block + 1


ALL = tuple(drafters.names())


@pytest.mark.parametrize("name", ALL)
def test_outputs_do_not_depend_on_concurrency_or_admission_order(tiny, name):
    """fp32, T = 1: the same prompts at concurrency 1 and 8, and in reverse order at concurrency 3, give every
    request the same tokens (counter-based draws keyed by request seed, position and purpose)."""
    reqs = _requests(8, seed=6)
    drafter = drafters.create(name, tiny)

    def outputs(order, concurrency):
        results = []
        config = EngineConfig(max_new_tokens=20, temperature=1.0, block_size=4, concurrency=concurrency)
        RoundLoop(tiny, drafter, config).run(order, results.append)
        assert all(r.status == "ok" for r in results), [r.error for r in results]
        return {r.request.request_id: r.output_ids for r in results}

    alone = outputs(reqs, 1)
    assert outputs(reqs, 8) == alone
    assert outputs(reqs[::-1], 3) == alone
    assert len(set(alone.values())) == len(reqs)  # distinct seeds, distinct samples


def test_batch_is_held_while_the_queue_has_requests(tiny):
    """Continuous batching: every round before the queue runs dry runs at the full concurrency."""
    reqs = _requests(12, seed=2)
    res = _run(tiny, "ngram", reqs, max_new_tokens=20, temperature=1.0, concurrency=4)
    rounds = [x for r in res.values() for x in r.rounds]
    queued = [x for x in rounds if x.waiting > 0]
    assert queued and all(x.batch == 4 for x in queued)
    assert any(x.batch < 4 for x in rounds if x.waiting == 0)  # the tail drains once nothing is left to admit


def test_model_mask_only_where_it_equals_ours(monkeypatch):
    """A forward with every cache column valid leaves the causal mask to the model, with the same logits; a model
    with a sliding window (its own mask would differ from ours) always gets the explicit mask."""
    from transformers import LlamaConfig, MistralConfig, Qwen3Config

    from dspark_bench.target.model import full_causal

    assert full_causal(LlamaConfig()) and full_causal(Qwen3Config(use_sliding_window=False))
    assert not full_causal(MistralConfig(sliding_window=64))
    assert not full_causal(Qwen3Config(use_sliding_window=True, max_window_layers=1, num_hidden_layers=2))
    prompt = random_prompts(1, seed=5)[0]
    target = tiny_target("llama")
    built = []
    explicit = target._mask_bias
    monkeypatch.setattr(target, "_mask_bias", lambda mask, width: built.append(width) or explicit(mask, width))
    batch, _ = target.prefill([prompt])
    own = target.forward_block(batch, torch.tensor([[5, 6, 7]]), [3]).logits
    assert built == []  # one row, no hole: the model's own mask
    windowed = tiny_target("llama")
    windowed.config.sliding_window = 64
    windowed._own_mask_ok = full_causal(windowed.config)
    explicit_w = windowed._mask_bias
    monkeypatch.setattr(windowed, "_mask_bias", lambda mask, width: built.append(width) or explicit_w(mask, width))
    batch, _ = windowed.prefill([prompt])
    forced = windowed.forward_block(batch, torch.tensor([[5, 6, 7]]), [3]).logits
    assert built == [len(prompt), 3]  # the prefill and the block both got the explicit mask
    assert torch.allclose(own, forced, atol=1e-5)  # same weights (seed 0), the same mask either way


def test_pack_moves_only_what_must_move():
    """The compaction plan keeps each row's valid columns in order, fits them in the new width, and leaves in
    place every column that fits: a row whose prefix starts at column 0 moves only its tail."""
    from dspark_bench.target.model import _pack

    rng = np.random.default_rng(3)
    for _ in range(200):
        mask = rng.random((5, 30)) < 0.6
        width = int(mask.sum(1).max())
        start, source, new = _pack(mask, width)
        assert new.shape == (5, width) and (new.sum(1) == mask.sum(1)).all()
        for r in range(5):
            cols, dest = np.flatnonzero(mask[r]), np.flatnonzero(new[r])
            assert (dest <= cols).all()  # columns only move left, in order
            moved = dest != cols
            assert not moved.any() or dest[moved].min() >= start
            assert (source[r, dest[dest >= start] - start] == cols[dest >= start]).all()
    # prefix [0, 6) then holes and a tail: 3 kept block slots at columns 8, 11, 12 of a 13-column cache
    mask = np.zeros((2, 13), dtype=bool)
    mask[0, :6] = mask[0, [8, 11, 12]] = True  # 9 valid: the longest row
    mask[1, :4] = mask[1, [8]] = True  # 5 valid: its column 8 fits in a 9-column cache and stays
    start, source, new = _pack(mask, 9)
    assert start == 6 and source[0].tolist() == [8, 11, 12]
    assert np.flatnonzero(new[1]).tolist() == [0, 1, 2, 3, 8] and source[1].tolist() == [6, 7, 8]

"""Reduced draft vocabulary (drafters/vocab.py): building the list, the restricted head's law, exact
losslessness by enumeration, every model drafter drafting inside the list, checkpoints and training over it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import TINY_EOS, random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.core.verify import Sampling, sample, speculative_accept, to_probs
from dspark_bench.drafters import registry, vocab
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.lossless import exact
from dspark_bench.lossless.synthetic import MarkovChain, SyntheticDrafter, SyntheticTarget
from dspark_bench.scheduling.schedulers import Fixed
from dspark_bench.train import data, features, methods, trainer

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL_DRAFTERS = ("dspark", "dflash", "eagle3", "mtp")


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


# ---- building the list ---------------------------------------------------------------------------------------
def test_build_vocab_takes_the_most_frequent_with_ties_to_the_smaller_id_and_keeps_the_specials():
    counts = torch.tensor([0, 5, 9, 5, 5, 1, 0, 7])
    assert vocab.build_vocab(counts, 3).tolist() == [1, 2, 7]  # 9, 7, then the first of the three 5s
    assert vocab.build_vocab(counts, 4).tolist() == [1, 2, 3, 7]
    assert vocab.build_vocab(counts, 3, always=(6, 0)).tolist() == [0, 2, 6]  # specials first, never counted
    assert vocab.build_vocab(counts, 8).tolist() == list(range(8))  # N = V: every id, unseen ones too
    for bad, always in ((1, (0, 6)), (9, ())):
        with pytest.raises(vocab.VocabError, match="size"):
            vocab.build_vocab(counts, bad, always)


def test_token_counts_and_coverage():
    counts = vocab.token_counts([[1, 2, 2], [], [2, 4]], 6)
    assert counts.tolist() == [0, 1, 3, 0, 1, 0]
    assert vocab.coverage(counts, torch.tensor([2, 4])) == pytest.approx(0.8)
    with pytest.raises(vocab.VocabError, match="0..5"):
        vocab.token_counts([[6]], 6)


def test_vocab_for_counts_only_responses_and_always_holds_eos(target):
    seqs = [data.TrainSequence("a", (50, 51, 52, 7, 7, 8), 3), data.TrainSequence("b", (50, 9, 9, 9), 1)]
    ids = vocab.vocab_for(target, seqs, 4)
    assert ids.tolist() == sorted({TINY_EOS, 9, 7, 8})  # prompt tokens 50..52 are never counted
    assert TINY_EOS in vocab.special_ids(target)


def test_check_ids_rejects_bad_lists():
    for bad in (torch.tensor([3, 1]), torch.tensor([0, 99]), torch.tensor([1.0, 2.0]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(vocab.VocabError):
            vocab.check_ids(bad, 96)
    with pytest.raises(vocab.VocabError, match="EOS"):
        vocab.check_ids(torch.tensor([0, 1, 3]), 96, required=(2,))


def test_vocab_file_round_trip(tmp_path):
    ids = torch.tensor([0, 2, 5])
    path = vocab.write_vocab(tmp_path / "v.json", ids, {"coverage": 0.5})
    assert torch.equal(vocab.read_vocab(path), ids)
    path.write_text(json.dumps({"format": "other", "ids": [1], "size": 1}))
    with pytest.raises(vocab.VocabError, match="not a"):
        vocab.read_vocab(path)


# ---- the restricted head --------------------------------------------------------------------------------------
def _head(vocab_size=12, d=5, ids=(0, 2, 3, 7, 11), seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab_size, d, generator=g, dtype=torch.float64) * 2
    return weight, vocab.DraftHead(weight, None if ids is None else torch.tensor(ids)), torch.randn(4, 3, d, generator=g,
                                                                                                     dtype=torch.float64)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_law_is_the_softmax_over_the_subset_and_exactly_zero_elsewhere(temperature):
    weight, head, h = _head()
    ids = head.ids
    q = to_probs(head.logits(h), temperature)  # [4, 3, V]
    outside = torch.ones(weight.shape[0], dtype=torch.bool)
    outside[ids] = False
    assert torch.all(q[..., outside] == 0)
    assert torch.allclose(q[..., ids].sum(-1), torch.ones(4, 3))
    want = torch.softmax((h @ weight[ids].T) / temperature, -1).float()
    assert torch.allclose(q[..., ids], want, atol=1e-6)
    assert head.sub_logits(h).shape == (4, 3, len(ids))


@pytest.mark.parametrize("rows,vocab_size,temperature", [
    (1, 12, 1.0), (3, 12, 0.6), (3, 12, 0.0), (64, 4096, 1.0),
    (3, 12, Sampling(0.8, top_p=0.8, top_k=3, min_p=0.05)), (64, 4096, Sampling(1.0, top_p=0.9, top_k=50)),
    (64, 4096, Sampling(1.2, top_k=2000, min_p=0.01)),  # top-k beyond the N = 1024 draftable tokens: no cut
])
def test_head_space_draw_is_the_full_space_draw(rows, vocab_size, temperature):
    """DraftHead.draw over the N columns: the law written to S's columns of a zeroed buffer (exact zeros elsewhere)
    is to_probs of the -inf-padded full logits up to float32 rounding (the softmax sums N values, not V), the token
    is drawn from exactly the law written, and it is the full-space token (here in every row, one- and two-level).
    Under the sampling filters too: they cut the same tokens in head space as over the padded full logits."""
    g = torch.Generator().manual_seed(rows)
    ids = torch.randperm(vocab_size, generator=g)[: max(5, vocab_size // 4)].sort().values
    head = vocab.DraftHead(torch.randn(vocab_size, 6, generator=g), ids)
    h = torch.randn(rows, 6, generator=g)
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    out = head.law_buffer(rows)
    assert out.shape == (rows, vocab_size) and torch.all(out == 0)
    tokens = head.draw(head.sub_logits(h), temperature, u, out)
    full = to_probs(head.logits(h), temperature)
    outside = torch.ones(vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert torch.all(out[:, outside] == 0) and torch.allclose(out, full, rtol=1e-6, atol=1e-8)
    assert torch.equal(out > 0, full > 0)  # the filters cut the same tokens in head space
    assert torch.equal(tokens, sample(out, u))  # drawn from the law handed to the verifier
    assert torch.equal(tokens, sample(full, u))
    assert set(tokens.tolist()) <= set(ids.tolist())
    free = vocab.DraftHead.full_space(vocab_size)  # no list: draws over every column, as before
    logits = torch.randn(rows, vocab_size, generator=g)
    buf = free.law_buffer(rows)
    assert torch.equal(free.draw(logits, temperature, u, buf), sample(to_probs(logits, temperature), u))
    assert torch.equal(buf, to_probs(logits, temperature))


def test_greedy_is_the_argmax_over_the_subset():
    weight, head, h = _head()
    q = to_probs(head.logits(h), 0.0)
    best = head.ids[(h @ weight[head.ids].T).argmax(-1)]
    assert torch.equal(q.argmax(-1), best) and torch.all(q.sum(-1) == 1)
    full = (h @ weight.T).argmax(-1)
    assert not torch.equal(full, best), "the test needs a case where the full argmax lies outside the subset"


def test_full_list_equals_the_full_head():
    weight, every, h = _head(ids=tuple(range(12)))
    _, full, _ = _head(ids=None)
    assert torch.equal(every.logits(h), full.logits(h))
    for t in (1.0, 0.0):
        assert torch.equal(to_probs(every.logits(h), t), to_probs(full.logits(h), t))
    assert torch.equal(full.logits(h), (h @ weight.T).float())


def test_full_head_is_the_targets_own_head(target):
    h = torch.randn(3, target.hidden_size)
    assert torch.equal(vocab.DraftHead.of(target, None).logits(h), target.lm_head(h).float())


def test_labels_map_into_the_subset_and_flag_the_rest():
    _, head, _ = _head()
    idx, inside = head.labels(torch.tensor([[0, 1, 7], [11, 12 - 2, 3]]))
    assert inside.tolist() == [[True, False, True], [True, False, True]]
    assert torch.equal(head.ids[idx][inside], torch.tensor([0, 7, 11, 3]))


def test_target_law_is_restricted_and_renormalised():
    weight, head, h = _head()
    p = torch.softmax(h @ weight.T, -1)
    want = p[..., head.ids] / p[..., head.ids].sum(-1, keepdim=True)
    assert torch.allclose(head.target_law(h), want.float(), atol=1e-6)


# ---- exactness: the output law is the target's with a reduced head ----------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_exact_output_law_with_a_reduced_head_equals_the_target(k, temperature):
    """A Markov drafter whose logits come from a reduced DraftHead (3 of 5 tokens, EOS included) over a random
    head: the enumerated speculative output law equals the target's law of the first 4 tokens."""
    g = torch.Generator().manual_seed(3)
    v, eos = 5, 1
    target = SyntheticTarget(MarkovChain.random(v, g), eos_ids=(eos,))
    weight, hidden = torch.randn(v, 4, generator=g, dtype=torch.float64), torch.randn(v, 4, generator=g, dtype=torch.float64)
    head = vocab.DraftHead(weight, torch.tensor([0, 1, 3]))
    logits = head.logits(hidden).double()  # row a: the draft logits after token a, -inf at tokens 2 and 4
    drafter = SyntheticDrafter(SyntheticDrafter.Config(MarkovChain(logits), torch.full((v, k), 0.5)), target)
    setting = exact.Setting(target, drafter, Fixed(), speculative_accept, k, temperature)
    probs = setting.probs
    for context in range(v):
        spec = exact.spec_law(setting, context, 4, False, {})
        assert exact.max_abs_error(spec, exact.markov_law(probs, context, 4, target.eos_ids)) < 1e-9
        assert sum(spec.values()) == pytest.approx(1.0, abs=1e-9)
    blocks = exact.draft_blocks(drafter, 0, k, temperature)  # the blocks drafted with positive probability
    assert blocks and not any(t in (2, 4) for b in blocks for t in b.tokens)


# ---- every model drafter -------------------------------------------------------------------------------------------
def _vocab_file(tmp_path, target, size=24):
    counts = torch.zeros(target.vocab_size, dtype=torch.long)
    counts[torch.arange(target.vocab_size) % 3 == 0] = 1  # a list of every third token (plus EOS)
    ids = vocab.build_vocab(counts, size, vocab.special_ids(target))
    return vocab.write_vocab(tmp_path / "vocab.json", ids, {}), ids


class Recording:
    """Wraps a drafter and keeps every proposal (and where each one's draft laws lay)."""

    def __init__(self, inner):
        self.inner, self.proposals, self.buffers = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, ctx):
        out = self.inner.propose(ctx)
        if out.q is not None:  # the engine's draft laws live in memory reused next round: keep a copy
            self.buffers.append(out.q.untyped_storage().data_ptr())
            out = dataclasses.replace(out, q=out.q.clone())
        self.proposals.append(out)
        return out


def _run(target, drafter, temperature, concurrency=2):
    reqs = [Request(i, tuple(p), 5 + i) for i, p in enumerate(random_prompts(3, seed=4))]
    results = []
    RoundLoop(target, drafter, EngineConfig(max_new_tokens=16, temperature=temperature, block_size=4,
                                         concurrency=concurrency)).run(reqs, results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return {r.request.request_id: r.output_ids for r in results}


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_draft_laws_in_reused_memory_give_the_tokens_of_fresh_memory(name, target, tmp_path, monkeypatch):
    """The engine lends its drafter memory for the draft laws (``DraftContext.scratch``): one buffer serves every
    round (zero outside the list since no draw writes there), and the tokens are those of a fresh buffer each
    round."""
    path, _ = _vocab_file(tmp_path, target)
    options = {"draft_vocab": str(path), **({"depth": 3} if name == "mtp" else {})}
    rec = Recording(registry.create(name, target, options))
    reused = _run(target, rec, 1.0)
    assert len(rec.buffers) > 3 and len(set(rec.buffers)) <= 2  # made once, grown at most once
    made = vocab.DraftHead.law_buffer
    monkeypatch.setattr(vocab.DraftHead, "law_buffer",
                        lambda self, *shape, device=None, scratch=None: made(self, *shape, device=device))
    assert _run(target, registry.create(name, target, options), 1.0) == reused


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_drafters_draft_inside_the_list_and_stay_exact(name, target, tmp_path):
    path, ids = _vocab_file(tmp_path, target)
    options = {"draft_vocab": str(path), **({"depth": 3} if name == "mtp" else {})}
    inner = registry.create(name, target, options)
    assert torch.equal(inner.model.draft_vocab.cpu(), ids)
    greedy = _run(target, inner, 0.0)
    assert greedy == _run(target, drafters.create("none", target), 0.0)  # the contract, with a reduced head
    rec = Recording(registry.create(name, target, options))
    _run(target, rec, 1.0)
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert rec.proposals
    for p in rec.proposals:
        for r in range(p.tokens.shape[0]):
            n = int(p.lengths[r])
            assert all(int(t) in set(ids.tolist()) for t in p.tokens[r, :n])
            assert torch.all(p.q[r, :n][:, outside] == 0)
            assert torch.allclose(p.q[r, :n].sum(-1), torch.ones(n))


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_checkpoint_ships_the_list_and_full_overrides_it(name, target, tmp_path):
    m = methods.method(name)
    seqs = [data.TrainSequence(f"s{i}", tuple(range(3 + i, 40 + i)), 10) for i in range(4)]
    options = methods.MethodOptions(num_anchors=8, markov_rank=8, draft_vocab=20)
    config = trainer.TrainConfig(name, steps=2, batch_size=2, lr=1e-3, warmup=0, save_every=100, options=options)
    final = trainer.train(config, m, target, seqs, features.OnlineFeatures(target, m.taps(target, options)), tmp_path)
    want = vocab.vocab_for(target, seqs, 20)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(final / "model.safetensors"))[vocab.STATE_KEY], want)
    loaded = registry.create(name, target, {"checkpoint": str(final)})
    assert torch.equal(loaded.model.draft_vocab.cpu(), want)
    full = registry.create(name, target, {"checkpoint": str(final), "draft_vocab": "full"})
    assert full.model.draft_vocab is None and full.model.draft_head.size == target.vocab_size


def test_dspark_markov_rows_follow_the_list(target, tmp_path):
    path, ids = _vocab_file(tmp_path, target)
    d = registry.create("dspark", target, {"draft_vocab": str(path)})
    w2 = d.model.markov_head.markov_w2
    assert torch.equal(w2.rows.cpu(), ids)
    e = torch.randn(2, w2.in_features)
    full = e @ w2.weight.T
    assert torch.allclose(w2(e, compact=True), full[:, ids]) and torch.all(w2(e)[:, ids] == w2(e, compact=True))
    d.model.set_draft_vocab(None)
    assert w2.rows is None and torch.equal(w2(e), torch.nn.functional.linear(e, w2.weight))


@pytest.mark.parametrize("rows", [1, 8])  # a lone request's Markov step and a batch of 8
def test_markov_rows_kept_for_decoding_follow_every_change(target, tmp_path, rows):
    """Without autograd the selected rows are kept (vocab.RowLinear): an optimizer step, a load and another list
    must each make them again, and under autograd the gradient still reaches the full weight's rows."""
    path, ids = _vocab_file(tmp_path, target)
    w2 = registry.create("dspark", target, {"draft_vocab": str(path)}).model.markov_head.markov_w2
    e = torch.randn(rows, w2.in_features)

    def kept():
        with torch.no_grad():
            return w2(e, compact=True)

    def fresh():
        return (e @ w2.weight.detach().T)[:, w2.rows]

    assert torch.allclose(kept(), fresh(), atol=1e-5)
    product = w2._product()
    assert w2._product() is product  # kept while nothing changed
    (w2(e, compact=True) ** 2).sum().backward()  # under autograd: rows selected at the call
    assert w2.weight.grad is not None and bool(w2.weight.grad[ids].abs().sum() > 0)
    assert not bool(w2.weight.grad[[i for i in range(w2.out_features) if i not in set(ids.tolist())]].any())
    torch.optim.SGD(w2.parameters(), lr=1.0).step()  # an in-place step
    assert w2._product() is not product and torch.allclose(kept(), fresh(), atol=1e-5)
    w2.load_state_dict({"weight": torch.randn_like(w2.weight)}, strict=False)  # a load, in place
    assert torch.allclose(kept(), fresh(), atol=1e-5)
    w2.rows = ids[: len(ids) // 2].clone()  # another list
    assert kept().shape == (rows, len(ids) // 2) and torch.allclose(kept(), fresh(), atol=1e-5)


# ---- training over the list ------------------------------------------------------------------------------------------
def test_block_training_scores_only_labels_inside_the_list(target):
    """DFlash's loss over the list equals the hand-computed CE over the kept slots, in head space."""
    m = methods.method("dflash")
    options = methods.MethodOptions(num_anchors=4)
    model = m.build(target, options)
    seqs = [data.TrainSequence(f"s{i}", tuple(range(3 + i, 30 + i)), 6) for i in range(2)]
    ids = vocab.vocab_for(target, seqs[:1], 16)
    model.set_draft_vocab(ids)
    batch = features.OnlineFeatures(target, m.taps(target, options))(seqs)
    out = model.loss(batch, torch.Generator().manual_seed(0), 4, 4.0)
    view = model.train_view(batch, torch.Generator().manual_seed(0), 4)
    assert view.pi.shape[-1] == 16 and torch.allclose(view.pi.sum(-1), torch.ones(view.pi.shape[:-1]))
    assert bool((~view.in_vocab & view.targets.validity).any()) and bool((view.in_vocab & view.targets.validity).any())
    logq = torch.log_softmax(view.h.float() @ target.model.get_output_embeddings().weight[ids].T, -1)
    ce = -logq.gather(-1, view.labels.unsqueeze(-1)).squeeze(-1)
    w = torch.exp(-torch.arange(ce.shape[-1]) / 4.0) * view.targets.validity * view.in_vocab
    assert float(out.loss.detach()) == pytest.approx(float(((ce * w).sum() / w.sum()).detach()), rel=1e-5)


@pytest.mark.parametrize("name", MODEL_DRAFTERS)
def test_training_over_the_list_lowers_the_loss_and_resumes_exactly(name, target, tmp_path):
    m = methods.method(name)
    g = torch.Generator().manual_seed(1)
    seqs = [data.TrainSequence(f"s{i}", tuple(torch.randint(3, 40, (30,), generator=g).tolist()), 6) for i in range(4)]
    options = methods.MethodOptions(num_anchors=8, markov_rank=8, draft_vocab=24)
    config = trainer.TrainConfig(name, steps=8, batch_size=4, lr=3e-3, warmup=1, save_every=4, options=options)
    source = features.OnlineFeatures(target, m.taps(target, options))
    records = []
    final = trainer.train(config, m, target, seqs, source, tmp_path / "a", on_step=records.append)
    losses = [r.loss for r in records]
    assert sum(losses[-2:]) < sum(losses[:2]), losses

    class Stop(Exception):
        pass

    def stop(record):
        if record.step == 5:
            raise Stop

    with pytest.raises(Stop):
        trainer.train(config, m, target, seqs, source, tmp_path / "b", on_step=stop)
    resumed = trainer.train(config, m, target, seqs, source, tmp_path / "b", resume=True)
    from safetensors.torch import load_file

    a, b = load_file(str(final / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and vocab.STATE_KEY in a and all(torch.equal(a[k], b[k]) for k in a)


def test_complete_rows_reads_a_folder_being_generated_without_writing(tmp_path):
    row = {"id": "a", "domain": "chat", "prompt": "p", "prompt_ids": [5, 6], "response_ids": list(range(10, 30)),
           "finish_reason": "stop", "stop_id": TINY_EOS, "shard": 0}
    (tmp_path / data.MANIFEST).write_text(json.dumps({"format": data.FORMAT, "spec": {"n": 5, "shard_size": 2}}))
    rows = [dict(row, id=f"r{i}", shard=s) for i, s in enumerate((0, 0, 1, 2))]  # shard 1 lacks a row; 2 is the last
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"id": "torn'
    (tmp_path / data.RESPONSES).write_text(text)
    assert [r["id"] for r in data.complete_rows(tmp_path)] == ["r0", "r1", "r3"]  # shard 2 holds 1 of n=5's rows
    seqs, n = data.complete_sequences(tmp_path)
    assert n == 3 and [s.input_ids[s.loss_start:] for s in seqs] == [(*range(10, 30), TINY_EOS)] * 3
    assert (tmp_path / data.RESPONSES).read_text() == text


def test_exact_target_law_makes_the_analytic_acceptance_the_full_vocabularys():
    """Inside vocab.exact_target_law the losses' alpha* is sum_v min(q_v, p_v) over all V (q is zero outside the
    list); outside it, the acceptance conditional on the list (pi renormalised over S), which is larger."""
    from dspark_bench.drafters.blockloss import analytic_acceptance, tv_l1
    from dspark_bench.drafters.chain import tv_acceptance

    weight, head, h = _head()
    p = torch.softmax(h @ weight.T, -1).float()  # [4, 3, V]
    q = torch.softmax(torch.randn(4, 3, head.size, generator=torch.Generator().manual_seed(5)), -1)
    exact = torch.minimum(q, p[..., head.ids]).sum(-1)
    with vocab.exact_target_law():
        pi = head.target_law(h)
        assert torch.allclose(pi, p[..., head.ids], atol=1e-6)
        assert torch.allclose(analytic_acceptance(tv_l1(q, pi)), exact, atol=1e-5)
        assert torch.allclose(tv_acceptance(q, pi), exact, atol=1e-5)
    pi = head.target_law(h)  # the training law again
    conditional = torch.minimum(q, pi).sum(-1)
    assert torch.allclose(pi.sum(-1), torch.ones(4, 3)) and torch.allclose(tv_acceptance(q, pi), conditional, atol=1e-5)
    assert bool((conditional >= exact - 1e-6).all()) and bool((conditional > exact + 1e-2).any())
    full_weight, full, hf = _head(ids=None)  # the full head: the context changes nothing
    with vocab.exact_target_law():
        assert torch.equal(full.target_law(hf), torch.softmax((hf @ full_weight.T).float(), -1))
        assert vocab.missing_mass(torch.ones(3)) == 0
    assert vocab.missing_mass(torch.full((3,), 0.1)) == 0.0


def test_markov_rows_of_an_inference_mode_weight_are_selected_at_every_call(target, tmp_path):
    """A weight made under torch.inference_mode keeps no change counter: nothing is kept, and a change made in that
    mode is seen at the next call."""
    path, ids = _vocab_file(tmp_path, target)
    w2 = registry.create("dspark", target, {"draft_vocab": str(path)}).model.markov_head.markov_w2
    with torch.inference_mode():
        w2.weight = torch.nn.Parameter(torch.randn_like(w2.weight), requires_grad=False)
        e = torch.randn(2, w2.in_features)
        first = w2(e, compact=True)
        w2.weight.mul_(2.0)  # in place, uncounted
        second = w2(e, compact=True)
    assert w2._selected is None
    torch.testing.assert_close(second, 2 * first)

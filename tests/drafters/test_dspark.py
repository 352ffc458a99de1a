"""DSpark and DFlash drafters: block visibility, the Markov head, q = the sampling law, losses, training,
checkpoints (ours and DeepSeek's format) and greedy equivalence with vanilla decoding."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import random_prompts, tiny_target
from scipy.stats import chisquare

from dspark_bench.core.verify import to_probs
from dspark_bench.drafters import dflash, dspark, registry  # noqa: F401  (registration side effect)
from dspark_bench.drafters.base import DraftContext, Slot
from dspark_bench.drafters.blockdraft import default_taps, shipped
from dspark_bench.drafters.blockloss import (
    acceptance_by_position,
    block_targets,
    position_weights,
    sample_anchors,
    tv_l1,
    weighted_mean,
)
from dspark_bench.drafters.checkpoint import CheckpointError
from dspark_bench.drafters.dspark import MarkovHead, dspark_loss_terms, dspark_total, sample_markov
from dspark_bench.drafters.types import TrainBatch
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.target.model import Features

METHODS = ("dspark", "dflash")


def make(name, target, **options):
    return registry.create(name, target, options)


def start_slot(drafter, target, tokens, rid=0, seed=0, temperature=1.0, block=7, edit=None):
    """A slot whose current token is tokens[-1]; the features of tokens[:-1] (changed by ``edit`` first, when
    given) are delivered by ``begin``."""
    _, out = target.prefill([list(tokens[:-1])], drafter.feature_layers)
    features = out.features[0] if edit is None else edit(out.features[0])
    slot = Slot(rid, list(tokens), len(tokens) - 1, seed, features)
    ctx = DraftContext(target, temperature, block, [slot])
    drafter.begin(ctx, [slot])
    return ctx


def synthetic_batch(target, taps, rows=8, length=40, prompt=8, seed=0) -> TrainBatch:
    """Target-sampled sequences (T=1) with their target features; the loss covers the sampled part."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.vocab_size, (rows, prompt), generator=g)
    with torch.no_grad():
        for _ in range(length - prompt):
            probs = torch.softmax(target.model(ids).logits[:, -1].float(), -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
    _, out = target.prefill(ids.tolist(), taps)
    loss_mask = torch.zeros(rows, length, dtype=torch.bool)
    loss_mask[:, prompt:] = True
    layers = torch.stack([f.layers for f in out.features]).clone()  # plain tensors (prefill makes inference ones)
    final = torch.stack([f.final for f in out.features]).clone()
    return TrainBatch(ids, loss_mask, torch.ones(rows, length, dtype=torch.bool), layers, final)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


@pytest.fixture(scope="module")
def qwen():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def trained(llama):
    """Each method trained 30 AdamW steps on one synthetic batch: (drafter, losses, mean acceptances)."""
    out = {}
    for name in METHODS:
        drafter = make(name, llama, seed=3)
        batch = synthetic_batch(llama, drafter.feature_layers)
        opt = torch.optim.AdamW(drafter.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)
        losses, accept = [], []
        drafter.model.train()
        for _ in range(30):
            result = drafter.model.loss(batch, g, num_anchors=16, decay_gamma=4.0)
            opt.zero_grad()
            result.loss.backward()
            opt.step()
            losses.append(result.terms["loss"])
            accept.append(float(result.acceptance.mean()))
        drafter.model.eval()
        out[name] = (drafter, losses, accept)
    return out


# ---- (a) the block never sees context at or after its anchor --------------------------------------------------------
def test_training_mask_hides_context_at_and_after_the_anchor(llama):
    model = make("dspark", llama).model
    g = torch.Generator().manual_seed(0)
    n, taps = 20, len(model.arch.taps)
    layers = torch.randn(1, n, taps, 64, generator=g)
    ids = torch.randint(3, 96, (1, n), generator=g)
    attention, anchors = torch.ones(1, n, dtype=torch.bool), torch.tensor([[5, 9]])
    h = model.train_hidden(layers, ids, attention, anchors)
    later = layers.clone()
    later[:, 9:] += torch.randn(later[:, 9:].shape, generator=g)
    later_ids = ids.clone()
    later_ids[:, 10:] = (later_ids[:, 10:] + 1) % 96
    assert torch.allclose(model.train_hidden(later, later_ids, attention, anchors), h, atol=1e-6)
    earlier = layers.clone()
    earlier[:, 8] += 1.0  # just before anchor 9, after anchor 5
    h2 = model.train_hidden(earlier, ids, attention, anchors)
    assert torch.allclose(h2[:, 0], h[:, 0], atol=1e-6)
    assert not torch.allclose(h2[:, 1], h[:, 1], atol=1e-3)


def test_inference_block_equals_training_block_and_grows_incrementally(qwen):
    drafter = make("dspark", qwen)
    tokens = random_prompts(1, seed=4, min_len=16, max_len=16)[0]
    p = 11
    _, full = qwen.prefill([tokens], drafter.feature_layers)
    h_train = drafter.model.train_hidden(full.features[0].layers[None], torch.tensor([tokens]),
                                         torch.ones(1, 16, dtype=torch.bool), torch.tensor([[p]]))[0, 0]
    ctx = start_slot(drafter, qwen, tokens[:7])  # context 0..5, anchor at 6
    with torch.inference_mode():
        drafter.block_hidden(ctx)
        slot = ctx.slots[0]
        slot.tokens = list(tokens[: p + 1])
        slot.new_features = Features(full.features[0].layers[6:p], full.features[0].final[6:p])
        drafter.commit(ctx, [slot], [])
        h_inf = drafter.block_hidden(ctx)[0]
    assert torch.allclose(h_inf, h_train, atol=1e-5)
    def bump(f):
        bumped = f.layers.clone()
        bumped[p - 1] += 1.0
        return Features(bumped, f.final)

    ctx2 = start_slot(drafter, qwen, tokens[: p + 1], edit=bump)  # same context at once, one position perturbed
    with torch.inference_mode():
        assert not torch.allclose(drafter.block_hidden(ctx2)[0], h_inf, atol=1e-3)


@pytest.mark.parametrize("name", METHODS)
def test_prompt_features_are_processed_in_begin(llama, name):
    """The prompt's context K/V is built when the request joins (prefill, in TTFT, as for Eagle3 and MTP), not
    in the first propose (decode)."""
    drafter = make(name, llama)
    tokens = random_prompts(1, seed=5)[0]
    ctx = start_slot(drafter, llama, tokens)
    state = ctx.slots[0].state
    assert state.pending == [] and state.length == len(tokens) - 1


def test_batched_blocks_equal_single_blocks(llama):
    drafter = make("dspark", llama)
    prompts = random_prompts(3, seed=12, min_len=4, max_len=14)  # contexts of different lengths: padded
    alone = [drafter.block_hidden(start_slot(drafter, llama, p, rid=i)) for i, p in enumerate(prompts)]
    ctxs = [start_slot(drafter, llama, p, rid=i) for i, p in enumerate(prompts)]
    batched = DraftContext(llama, 1.0, 7, [c.slots[0] for c in ctxs])
    with torch.inference_mode():
        assert torch.allclose(drafter.block_hidden(batched), torch.cat(alone), atol=1e-5)


def test_features_out_of_order_are_an_error(llama):
    drafter = make("dflash", llama)
    ctx = start_slot(drafter, llama, [5, 6, 7, 8])
    ctx.slots[0].tokens.append(9)  # a token committed without its features
    with pytest.raises(RuntimeError, match="not delivered in order"):
        drafter.propose(ctx)


# ---- (b) the Markov head ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_markov_sampling_matches_teacher_forcing_and_uses_only_previous_token(kind):
    torch.manual_seed(0)
    head = MarkovHead(kind, vocab=12, rank=4, hidden=8)
    g = torch.Generator().manual_seed(1)
    base, h, anchors = torch.randn(3, 5, 12, generator=g), torch.randn(3, 5, 8, generator=g), torch.tensor([1, 2, 3])

    u = torch.rand(3, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def run(b, hh):
        return sample_markov(b, hh, anchors, head, 1.0, u)

    with torch.no_grad():
        tokens, q, prev = run(base, h)
        assert torch.equal(prev[:, 0], anchors) and torch.equal(prev[:, 1:], tokens[:, :-1])
        assert torch.allclose(q, to_probs(base + head.teacher_forced(h, prev), 1.0), atol=1e-6)
        later = base.clone()
        later[:, 3:] += 5 * torch.randn(later[:, 3:].shape, generator=g)
        assert torch.equal(run(later, h)[0][:, :3], tokens[:, :3])  # x_1..x_3 ignore U_4, U_5
        if kind == "vanilla":  # the bias reads x_{k-1} only, not h
            assert torch.equal(run(base, torch.randn(h.shape, generator=g))[0], tokens)
            for k in range(5):  # q_k is exactly to_probs(U_k + E[x_{k-1}] P)
                bias = head.markov_w2(head.markov_w1(prev[:, k])).float()
                assert torch.equal(q[:, k], to_probs(base[:, k] + bias, 1.0))


def test_markov_off_samples_from_the_backbone_alone():
    """head None (DSpark's markov=False option): q_k = softmax(U_k), whatever the previous token."""
    g = torch.Generator().manual_seed(3)
    base, h = torch.randn(2, 4, 9, generator=g), torch.randn(2, 4, 6, generator=g)
    tokens, q, prev = sample_markov(base, h, torch.tensor([0, 1]), None, 1.0,
                                    torch.rand(2, 4, generator=g, dtype=torch.float64))
    assert torch.equal(q, to_probs(base, 1.0)) and torch.equal(prev[:, 1:], tokens[:, :-1])


# ---- (c) q is the law the tokens were drawn from -------------------------------------------------------------------
def _chi2(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square p-value, pooling bins with expected count < 5."""
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)]).double()
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)]).double()
    keep = exp > 0
    return float(chisquare(obs[keep].numpy(), exp[keep].numpy() * obs.sum().item() / exp[keep].sum().item()).pvalue)


@pytest.mark.parametrize("reduced", [False, True], ids=["full-head", "draft-vocab"])
@pytest.mark.parametrize("name", METHODS)
def test_q_is_the_distribution_tokens_were_sampled_from(llama, name, reduced):
    drafter, n = make(name, llama, seed=5), 4000
    if reduced:  # draws in head space (DraftHead.draw): q must still be the law of the tokens, zero outside
        keep = sorted(set(range(0, llama.vocab_size, 2)) | set(llama.eos_ids))
        drafter.model.set_draft_vocab(torch.tensor(keep))
        assert drafter.model.draft_head.size == len(keep) < llama.vocab_size
    if name == "dspark":  # make the Markov correction large enough to matter
        g = torch.Generator().manual_seed(2)
        for w in (drafter.model.markov_head.markov_w1.weight, drafter.model.markov_head.markov_w2.weight):
            w.data.copy_(torch.randn(w.shape, generator=g) * 0.45)
    tokens = random_prompts(1, seed=7)[0]
    _, out = llama.prefill([tokens[:-1]], drafter.feature_layers)
    slots = [Slot(i, list(tokens), len(tokens) - 1, i, out.features[0]) for i in range(n)]
    ctx = DraftContext(llama, 1.0, 2, slots)
    drafter.begin(ctx, slots)
    prop = drafter.propose(ctx)
    assert torch.allclose(prop.q.sum(-1), torch.ones(n, 2), atol=1e-5)
    assert torch.allclose(prop.q[:, 0], prop.q[:1, 0].expand(n, -1))  # same context: same q_1
    vocab = llama.vocab_size
    x1, x2 = (torch.bincount(prop.tokens[:, k], minlength=vocab) for k in (0, 1))
    assert _chi2(x1, n * prop.q[0, 0]) > 1e-3
    assert _chi2(x2, prop.q[:, 1].sum(0)) > 1e-3  # given x_1, x_2 ~ q_2(.|x_1): expected counts sum the rows
    if reduced:
        odd = torch.ones(llama.vocab_size, dtype=torch.bool)
        odd[keep] = False
        assert torch.all(prop.q[..., odd] == 0) and set(prop.tokens.flatten().tolist()) <= set(keep)
    if name == "dspark":  # negative control: the uncorrected law is rejected, so the test has power
        with torch.inference_mode():
            base = drafter.model.base_logits(drafter.block_hidden(DraftContext(llama, 1.0, 2, slots[:1])))
        assert _chi2(x2, n * to_probs(base[0, 1], 1.0)) < 1e-3


# ---- (d) loss math against hand-computed values ------------------------------------------------------------------
def test_position_weights_tv_and_weighted_mean():
    w = position_weights(torch.tensor([[True, True, False]]), decay_gamma=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(-0.5), 0.0]]))
    assert float(tv_l1(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5]))) == pytest.approx(1.0)
    term = torch.tensor([2.0, 4.0, float("nan")])
    assert float(weighted_mean(term, torch.tensor([1.0, 0.5, 0.0]))) == pytest.approx(8 / 3)
    alpha, valid = torch.tensor([[0.5, 1.0], [0.3, 0.2]]), torch.tensor([[True, True], [True, False]])
    assert torch.allclose(acceptance_by_position(alpha, valid), torch.tensor([0.4, 1.0]))


def test_dspark_loss_terms_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3), 0.0]])  # q = [.5, .5] and [.75, .25]
    pi = torch.tensor([[1.0, 0.0], [0.75, 0.25]])
    terms = dspark_loss_terms(logits, torch.tensor([0, 1]), pi, torch.tensor([0.0, math.log(3)]),
                              torch.tensor([1.0, 0.5]))
    ln2 = math.log(2)
    assert float(terms["ce"]) == pytest.approx((ln2 + 0.5 * math.log(4)) / 1.5)
    assert float(terms["l1"]) == pytest.approx(1.0 / 1.5)
    assert torch.allclose(terms["alpha"], torch.tensor([0.5, 1.0]))
    assert float(terms["conf"]) == pytest.approx((ln2 - 0.5 * math.log(0.75)) / 1.5)
    expected = 0.1 * float(terms["ce"]) + 0.9 * float(terms["l1"]) + float(terms["conf"])
    assert float(dspark_total(terms)) == pytest.approx(expected)


def test_block_targets_and_anchor_sampling():
    ids = torch.arange(10, 18).unsqueeze(0)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    t = block_targets(ids, mask, torch.tensor([[2, 4]]), torch.tensor([[True, True]]), 4)
    assert t.labels.tolist() == [[[13, 14, 15, 16], [15, 16, 17, 17]]]
    assert t.prev.tolist() == [[[12, 13, 14, 15], [14, 15, 16, 17]]]
    assert t.validity.tolist() == [[[True, True, True, False], [True, False, False, False]]]
    rows = torch.cat([mask, torch.zeros_like(mask)])  # the second row has no valid anchor
    anchors, keep = sample_anchors(rows, 10, torch.Generator().manual_seed(0))
    assert anchors.tolist() == [[2, 3, 4], [0, 0, 0]] and keep.tolist() == [[True] * 3, [False] * 3]
    g = torch.Generator().manual_seed(1)
    picks = torch.stack([sample_anchors(mask, 2, g)[0][0] for _ in range(600)])
    assert (picks[:, 0] < picks[:, 1]).all()  # distinct and sorted
    assert _chi2(torch.bincount(picks.flatten(), minlength=5)[2:5], torch.full((3,), 400.0)) > 1e-3


# ---- (e) training ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_training_lowers_loss_and_raises_acceptance(trained, name):
    _, losses, accept = trained[name]
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    assert sum(accept[-5:]) > sum(accept[:5])


# ---- (f) checkpoints -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_save_load_round_trip_is_exact(trained, llama, qwen, name, tmp_path):
    drafter = trained[name][0]
    folder = drafter.save(tmp_path / name)
    loaded = make(name, llama, checkpoint=str(folder))
    saved = drafter.model.state_dict()
    assert "mask_embedding" in saved and not any("embed_tokens" in k or "lm_head" in k for k in saved)
    assert saved.keys() == loaded.model.state_dict().keys()
    assert all(torch.equal(v, loaded.model.state_dict()[k]) for k, v in saved.items())
    tokens = random_prompts(1, seed=9)[0]
    a, b = (d.propose(start_slot(d, llama, tokens, seed=4)) for d in (drafter, loaded))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.q, b.q)
    assert (a.confidence is None) == (name == "dflash")
    assert a.confidence is None or torch.equal(a.confidence, b.confidence)
    other = "dflash" if name == "dspark" else "dspark"
    with pytest.raises(CheckpointError, match=f"holds a '{name}' drafter"):
        make(other, llama, checkpoint=str(folder))
    with pytest.raises(CheckpointError, match="trained for target"):
        make(name, tiny_target("llama", seed=1), checkpoint=str(folder))


def test_shipped_checkpoint_lookup(llama, tmp_path):
    assert shipped("dspark", llama, root=tmp_path) is None
    folder = tmp_path / llama.name / "dspark"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert shipped("dspark", llama, root=tmp_path) == folder


def test_config_options_and_errors(llama):
    assert default_taps(6) == (1, 2, 3, 4) and default_taps(36) == (1, 9, 18, 26, 34)
    assert make("dspark", llama, taps="1,3", markov_rank=8).feature_layers == (1, 3)
    with pytest.raises(ValueError, match="markov_head_type"):
        make("dspark", llama, markov_head_type="lstm")
    with pytest.raises(ValueError, match="last target layer"):
        make("dflash", llama, taps=(1, 5))
    rnn = make("dspark", llama, markov_head_type="rnn", markov_rank=8)
    rnn.model.loss(synthetic_batch(llama, rnn.feature_layers, rows=2, length=16), torch.Generator(), 4, 4.0).loss.backward()
    assert rnn.model.markov_head.joint_proj.weight.grad is not None
    assert rnn.propose(start_slot(rnn, llama, [5, 6, 7, 8])).tokens.shape == (1, 7)
    model = make("dspark", llama, mask_token_id=7).model
    assert not hasattr(model, "mask_embedding")
    emb = llama.model.get_input_embeddings().weight
    assert torch.equal(model.embed_block(torch.tensor([3]), 3)[0, 1:], emb[7].expand(2, -1))


# ---- (g) DeepSeek's checkpoint format ------------------------------------------------------------------------------
def deepseek_checkpoint(folder, target, rank=8, layers=2, taps=(1, 2, 4), **overrides):
    """A tiny DeepSpec-format folder: the target's config plus the draft keys, tensors named as released."""
    from safetensors.torch import save_file

    c = target.config
    d, heads, kv, hd, inter, vocab = 64, c.num_attention_heads, c.num_key_value_heads, c.head_dim, 128, 96
    g = torch.Generator().manual_seed(0)
    state = {"embed_tokens.weight": target.model.get_input_embeddings().weight,
             "lm_head.weight": target.model.get_output_embeddings().weight,
             "fc.weight": torch.randn(d, len(taps) * d, generator=g) * 0.05,
             "hidden_norm.weight": torch.ones(d), "norm.weight": torch.ones(d)}
    shapes = {"self_attn.q_proj": (heads * hd, d), "self_attn.k_proj": (kv * hd, d), "self_attn.v_proj": (kv * hd, d),
              "self_attn.o_proj": (d, heads * hd), "self_attn.q_norm": (hd,), "self_attn.k_norm": (hd,),
              "mlp.gate_proj": (inter, d), "mlp.up_proj": (inter, d), "mlp.down_proj": (d, inter),
              "input_layernorm": (d,), "post_attention_layernorm": (d,)}
    for i in range(layers):
        for name, shape in shapes.items():
            state[f"layers.{i}.{name}.weight"] = 1 + 0.1 * torch.randn(shape, generator=g) if len(shape) == 1 else \
                torch.randn(shape, generator=g) * 0.05
    if rank:
        state["markov_head.markov_w1.weight"] = torch.randn(vocab, rank, generator=g) * 0.3
        state["markov_head.markov_w2.weight"] = torch.randn(vocab, rank, generator=g) * 0.3
        state["confidence_head.proj.weight"] = torch.randn(1, d + rank, generator=g) * 0.05
        state["confidence_head.proj.bias"] = torch.zeros(1)
    config = {**c.to_dict(), "architectures": ["Qwen3DSparkModel"], "num_target_layers": c.num_hidden_layers,
              "num_hidden_layers": layers, "block_size": 4, "tie_word_embeddings": False,
              "layer_types": ["full_attention"] * layers, "mask_token_id": 95, "target_layer_ids": list(taps),
              "num_anchors": 16, "enable_confidence_head": bool(rank), "markov_rank": rank, "dtype": "bfloat16"}
    if rank:
        config.update(markov_head_type="vanilla", confidence_head_with_markov=True)
    config.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return state


def test_deepseek_dspark_checkpoint_loads(qwen, tmp_path):
    state = deepseek_checkpoint(tmp_path / "ds", qwen)
    drafter = make("dspark", qwen, checkpoint=str(tmp_path / "ds"))
    arch = drafter.model.arch
    assert (arch.taps, arch.num_layers, arch.mask_token_id, arch.markov_rank) == ((1, 2, 4), 2, 95, 8)
    mine = drafter.model.state_dict()
    assert mine.keys() == state.keys() - {"embed_tokens.weight", "lm_head.weight"}
    assert all(torch.equal(v.to(torch.bfloat16), state[k]) for k, v in mine.items())
    prop = drafter.propose(start_slot(drafter, qwen, random_prompts(1, seed=3)[0], block=4))
    assert prop.tokens.shape == (1, 4) and prop.confidence.shape == (1, 4)
    assert torch.allclose(prop.q.sum(-1), torch.ones(1, 4), atol=1e-5)
    mask_row = qwen.model.get_input_embeddings().weight[95]
    assert torch.equal(drafter.model.embed_block(torch.tensor([3]), 2)[0, 1], mask_row)


def test_deepseek_dflash_sharded_and_rope_theta_spelling(qwen, tmp_path):
    from safetensors.torch import save_file

    state = deepseek_checkpoint(tmp_path / "df", qwen, rank=0)
    theta = qwen.config.to_dict()["rope_parameters"]["rope_theta"]
    config = json.loads((tmp_path / "df" / "config.json").read_text())
    del config["rope_parameters"]
    (tmp_path / "df" / "config.json").write_text(json.dumps({**config, "rope_theta": theta}))
    (tmp_path / "df" / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for file, names in shards.items():
        save_file({k: state[k] for k in names}, str(tmp_path / "df" / file))
    index = {"weight_map": {k: f for f, names in shards.items() for k in names}}
    (tmp_path / "df" / "model.safetensors.index.json").write_text(json.dumps(index))
    drafter = make("dflash", qwen, checkpoint=str(tmp_path / "df"))
    assert all(torch.equal(v.to(torch.bfloat16), state[k]) for k, v in drafter.model.state_dict().items())
    with pytest.raises(CheckpointError, match="load it with drafter 'dflash'"):
        make("dspark", qwen, checkpoint=str(tmp_path / "df"))


@pytest.mark.parametrize("overrides, match", [
    ({"vocab_size": 97}, "vocab size 97"),
    ({"hidden_size": 32}, "hidden size 32"),
    ({"target_layer_ids": [1, 2, 5]}, "last target layer 5 is forbidden"),
    ({"target_layer_ids": [1, 2, 9]}, r"within 0\.\.4"),
    ({"target_layer_ids": [-2, 2, 4]}, r"-1 \(the embedding output\) or within 0\.\.4"),
    ({"num_target_layers": 8}, "num_target_layers 8"),
    ({"rope_parameters": {"rope_theta": 5.0, "rope_type": "default"}}, "RoPE"),
    ({"architectures": ["Gemma4DSparkModel"]}, "not supported"),
])
def test_deepseek_mismatch_errors_are_clear(qwen, tmp_path, overrides, match):
    deepseek_checkpoint(tmp_path / "bad", qwen, **overrides)
    with pytest.raises(ValueError, match=match):
        make("dspark", qwen, checkpoint=str(tmp_path / "bad"))


def test_deepseek_checkpoint_for_another_target_is_rejected(qwen, tmp_path):
    deepseek_checkpoint(tmp_path / "other", tiny_target("qwen3", seed=1))
    with pytest.raises(CheckpointError, match="not a copy of target"):
        make("dspark", qwen, checkpoint=str(tmp_path / "other"))


# ---- (h) greedy output equals vanilla decoding ---------------------------------------------------------------------
def _run(target, drafter, concurrency, temperature=0.0):
    reqs = [Request(i, tuple(p), 11 + i) for i, p in enumerate(random_prompts(3, seed=21))]
    results = []
    config = EngineConfig(max_new_tokens=16, temperature=temperature, block_size=5, concurrency=concurrency)
    RoundLoop(target, drafter, config).run(reqs, results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return {r.request.request_id: r.output_ids for r in results}, results


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("name", METHODS)
def test_greedy_output_equals_vanilla(request, trained, arch, name):
    target = request.getfixturevalue("llama" if arch == "llama" else "qwen")
    drafter = trained[name][0] if arch == "llama" else make(name, target)
    reference = _run(target, make("none", target), 1)[0]
    for concurrency in (1, 3):
        assert _run(target, drafter, concurrency)[0] == reference


def test_sampling_run_reports_confidence_and_split_times(trained, llama):
    """Each round carries confidences and the Markov head's compute, timed apart from the drafter's other
    forwards and from its sampling (the spans of dspark_bench.core.timing)."""
    _, results = _run(llama, trained["dspark"][0], 2, temperature=1.0)
    rounds = [r for res in results for r in res.rounds]
    assert all(r.confidence is not None and len(r.confidence) == r.proposed for r in rounds)
    assert all(0.0 <= c <= 1.0 for r in rounds for c in r.confidence)
    assert all(r.head_s > 0 and r.sample_s > 0 and r.draft_forward_s > r.head_s for r in rounds)
    assert all(r.head_s + r.sample_s < r.draft_s for r in rounds)
    off = make("dspark", llama, markov=False)
    _, results = _run(llama, off, 2, temperature=1.0)
    assert all(r.head_s == 0 and r.sample_s > 0 for res in results for r in res.rounds)


@pytest.mark.parametrize("name", METHODS)
def test_perturb_degrades_reproducibly(llama, name):
    """perturb=s adds seeded noise of s x each tensor's std to the drafter's weights (a degraded control for
    gates): same seed, same weights; every tensor moved by about s of its spread; the target is untouched."""
    clean, a, b = (make(name, llama, seed=3, **opts) for opts in ({}, {"perturb": 0.5}, {"perturb": 0.5}))
    target_before = llama.model.lm_head.weight.clone()
    for (key, w0), wa, wb in zip(clean.model.state_dict().items(), a.model.state_dict().values(),
                                 b.model.state_dict().values(), strict=True):
        assert torch.equal(wa, wb), key
        if w0.is_floating_point() and w0.numel() > 1 and w0.float().std() > 0:  # (constant norms: no spread)
            moved = float((wa - w0).float().std() / w0.float().std())
            assert 0.4 < moved < 0.6, (key, moved)
    assert torch.equal(llama.model.lm_head.weight, target_before)
    with pytest.raises(registry.DrafterError, match="perturb"):
        make(name, llama, perturb=-1.0)

"""Eagle3 and MTP drafters: layer numerics, loss math, inference caches, training, checkpoints, engine contract."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import TINY_EOS, random_prompts, tiny_target
from scipy.stats import chisquare

from dspark_bench.core.verify import Draws, Verdict, Verdicts, eos_stop, speculative_accept
from dspark_bench.drafters import deepseek_eagle3
from dspark_bench.drafters.base import DraftContext, Slot
from dspark_bench.drafters.blockloss import sample_positions
from dspark_bench.drafters.chain import (
    ChainState,
    masked_mean,
    shift_left,
    soft_cross_entropy,
    ttt_mask,
    tv_acceptance,
)
from dspark_bench.drafters.checkpoint import CheckpointError
from dspark_bench.drafters.eagle3 import Eagle3Drafter
from dspark_bench.drafters.layers import DecoderLayer, LayerSpec, attention_mask, stack_left
from dspark_bench.drafters.mtp import MTPDrafter
from dspark_bench.drafters.registry import DrafterError
from dspark_bench.drafters.types import TrainBatch
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop

DRAFTERS = {"eagle3": Eagle3Drafter, "mtp": MTPDrafter}


@pytest.fixture(scope="module")
def targets():
    return {"llama": tiny_target("llama"), "qwen3": tiny_target("qwen3")}


def make(name: str, target, **options):
    cls = DRAFTERS[name]
    return cls(cls.Config(**options), target)


def no_past(rows: int = 1) -> torch.Tensor:
    return torch.zeros(rows, 0, dtype=torch.bool)


# ---- layers ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_plain_layer_matches_hf_decoder_layer(targets, arch):
    """Our layer with the target's layer-0 weights reproduces HF's layer-0 output (RoPE, q/k norm, GQA)."""
    target = targets[arch]
    layer = DecoderLayer(LayerSpec.from_target(target))
    layer.load_state_dict(target.model.model.layers[0].state_dict())
    ids = torch.tensor([random_prompts(1, min_len=9, max_len=9)[0]])
    with torch.no_grad():
        want = target.model.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
        x = target.model.get_input_embeddings()(ids)
        got, _ = layer(x, None, torch.arange(9)[None], None, attention_mask(no_past(), 9))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_stack_left_pads_and_masks():
    a = (torch.ones(2, 3, 4), torch.ones(2, 3, 4) * 2)
    (k, v), valid = stack_left([a, None], torch.zeros(2, 0, 4))
    assert k.shape == (2, 2, 3, 4) and valid.tolist() == [[True] * 3, [False] * 3]
    assert float(v[0].sum()) == 2 * 24 and float(k[1].abs().sum()) == 0
    mask = attention_mask(torch.tensor([[False, True]]), 2)
    assert mask.int().tolist() == [[[0, 1, 1, 0], [0, 1, 1, 1]]]


def test_rope_parameters_and_rope_theta_are_both_read():
    base = dict(hidden_size=8, num_attention_heads=2, intermediate_size=16)
    assert LayerSpec.from_config({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}).rope_theta == 5e5
    assert LayerSpec.from_config({**base, "rope_theta": 1e6}).rope_theta == 1e6
    with pytest.raises(ValueError, match="rope_type"):
        LayerSpec.from_config({**base, "rope_parameters": {"rope_theta": 1.0, "rope_type": "yarn"}})


# ---- pure loss math (hand-computed values) -------------------------------------------------------------------
def test_soft_cross_entropy_and_tv_acceptance_by_hand():
    logits = torch.log(torch.tensor([[0.25, 0.75]]))
    target = torch.tensor([[0.5, 0.5]])
    assert soft_cross_entropy(logits, target).item() == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.75)))
    assert tv_acceptance(torch.tensor([0.25, 0.75]), torch.tensor([0.5, 0.5])).item() == pytest.approx(0.75)
    assert tv_acceptance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(0.0)
    assert masked_mean(torch.tensor([1.0, 2.0, 9.0]), torch.tensor([1.0, 1.0, 0.0])).item() == pytest.approx(1.5)
    assert masked_mean(torch.tensor([1.0]), torch.tensor([0.0])).item() == 0.0


def test_shift_left():
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 1).tolist() == [[2, 3, 4, 0]]
    assert shift_left(x, 5).tolist() == [[0, 0, 0, 0]]
    assert shift_left(torch.tensor([[True, False, True]]), 2).tolist() == [[True, False, False]]


def test_ttt_mask_by_hand():
    """n = 3, last position padding, step 1: step-0 keys causal over real positions (+ self), step-1 diagonal."""
    mask = ttt_mask(torch.tensor([[True, True, False]]), 1)
    assert mask.int().tolist() == [[
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]]


# ---- training data -------------------------------------------------------------------------------------------
def train_batch(target, taps, rows: int = 6, n: int = 20, seed: int = 0) -> TrainBatch:
    """Random sequences with target features; response from position 6; row 0 has 4 padding slots."""
    seqs = random_prompts(rows, vocab=target.vocab_size, seed=seed, min_len=n, max_len=n)
    _, out = target.prefill(seqs, taps)
    attention = torch.ones(rows, n, dtype=torch.bool)
    attention[0, n - 4 :] = False
    loss_mask = attention.clone()
    loss_mask[:, :6] = False
    layers = torch.stack([f.layers for f in out.features]).clone()  # clone: out of inference mode
    final = torch.stack([f.final for f in out.features]).clone()
    return TrainBatch(torch.tensor(seqs), loss_mask, attention, layers, final)


def test_eagle3_loss_composition(targets):
    """loss = sum_k 0.8^k sum_valid H(pi_{t+1+k}, q_{t,k}) / (B n), recomputed here from the step hiddens."""
    target = targets["qwen3"]
    model = make("eagle3", target).model
    batch = train_batch(target, model.taps)
    b, n = batch.input_ids.shape
    want = 0.0
    with torch.no_grad():
        out = model.loss(batch, torch.Generator(), ttt_length=3)
        pi = torch.softmax(target.lm_head(batch.final), -1)
        for k, h in enumerate(model.ttt_hiddens(batch, 3)):
            logq = torch.log_softmax(target.lm_head(model.norm(h)), -1)
            ce = -(pi[:, 1 + k : n] * logq[:, : n - 1 - k]).sum(-1)  # pi_{t+1+k} vs the prediction at t
            valid = batch.loss_mask[:, 2 + k :].float()
            want += 0.8**k * (ce[:, : n - 2 - k] * valid).sum() / (b * n)
    assert out.loss.item() == pytest.approx(float(want), rel=1e-5)
    assert out.acceptance.shape == (3,) and set(out.terms) == {"ce0", "ce1", "ce2", "loss"}


def test_eagle3_anchored_loss(targets):
    """num_anchors scores only sampled positions t whose step-0 token y_{t+2} is a response token, normalised by
    B N; recomputed here position by position, for room for every such position and for fewer."""
    target = targets["qwen3"]
    model = make("eagle3", target).model
    batch = train_batch(target, model.taps)
    b, n = batch.input_ids.shape
    first = torch.zeros_like(batch.loss_mask)
    first[:, : n - 2] = batch.loss_mask[:, 2:] & batch.attention[:, : n - 2]
    with torch.no_grad():
        pi = torch.softmax(target.lm_head(batch.final), -1)
        logq = [torch.log_softmax(target.lm_head(model.norm(h)), -1) for h in model.ttt_hiddens(batch, 3)]

        def recomputed(rows: list[list[int]], width: int) -> float:
            total = 0.0
            for k in range(3):
                for r, ts in enumerate(rows):
                    for t in ts:
                        if t + 2 + k < n and batch.loss_mask[r, t + 2 + k]:
                            total += 0.8**k * float(-(pi[r, t + 1 + k] * logq[k][r, t]).sum()) / (b * width)
            return total

        every = model.loss(batch, torch.Generator().manual_seed(0), ttt_length=3, num_anchors=n)
        rows = [torch.nonzero(first[r]).flatten().tolist() for r in range(b)]
        assert every.loss.item() == pytest.approx(recomputed(rows, max(map(len, rows))), rel=1e-5)

        few = model.loss(batch, torch.Generator().manual_seed(1), ttt_length=3, num_anchors=3)
        where, keep = sample_positions(first.bool(), 3, torch.Generator().manual_seed(1))
        assert keep.all() and bool(first.gather(1, where).all())
        assert few.loss.item() == pytest.approx(recomputed(where.tolist(), 3), rel=1e-5)
        assert few.loss.item() != pytest.approx(every.loss.item(), rel=1e-3)
    with pytest.raises(ValueError, match="generator"):
        model.loss(batch, None, ttt_length=2, num_anchors=3)


def test_ttt_steps_at_anchors_equal_the_full_steps_and_their_gradients(targets):
    """Steps 1..K-1 run at the drawn positions alone: the same hiddens and parameter gradients as the full TTT."""
    target = targets["qwen3"]
    model = make("eagle3", target).model.float()
    batch = train_batch(target, model.taps, rows=3, n=16)
    where = torch.tensor([[0, 0, 3, 9], [1, 5, 6, 14], [2, 7, 8, 15]])  # row 0: a duplicated dummy at 0; ends
    full = model.ttt_hiddens(batch, 4)
    part = model.ttt_hiddens(batch, 4, where)
    assert len(part) == 4
    for f, h in zip(full, part, strict=True):
        want = f.gather(1, where.unsqueeze(-1).expand(*where.shape, f.shape[-1]))
        torch.testing.assert_close(h, want, atol=1e-5, rtol=1e-5)

    def grads(hiddens, pick) -> list[torch.Tensor]:
        model.zero_grad()
        sum((pick(h) ** 2).sum() * (k + 1) for k, h in enumerate(hiddens)).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    g_full = grads(model.ttt_hiddens(batch, 4), lambda f: f.gather(1, where.unsqueeze(-1).expand(*where.shape, f.shape[-1])))
    g_part = grads(model.ttt_hiddens(batch, 4, where), lambda h: h)
    assert len(g_full) == len(g_part) > 0
    for a, b in zip(g_full, g_part, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_ttt_steps_equal_chain_drafting(targets):
    """TTT step k at position t = chain drafting from the cache of positions <= t with teacher-forced tokens."""
    target = targets["qwen3"]
    model = make("eagle3", target).model
    batch = train_batch(target, model.taps, rows=1, n=12)
    with torch.no_grad():
        hiddens = model.ttt_hiddens(batch, 4)
        g0, ids = model.context(batch.layers, batch.final), batch.input_ids
        for t in (0, 3, 6):
            out, kv = model(g0[:, : t + 1], ids[:, 1 : t + 2], torch.arange(t + 1)[None], None,
                            attention_mask(no_past(), t + 1))
            h = out[:, -1:]
            torch.testing.assert_close(h[0, 0], hiddens[0][0, t], atol=1e-5, rtol=1e-5)
            for k in range(1, 4):
                pos = torch.tensor([[t + k]])
                h, new = model(h, ids[:, t + 1 + k : t + 2 + k], pos, kv, attention_mask(torch.ones(1, t + k, dtype=torch.bool), 1))
                kv = (torch.cat([kv[0], new[0]], 2), torch.cat([kv[1], new[1]], 2))
                torch.testing.assert_close(h[0, 0], hiddens[k][0, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("soft", [False, True])
def test_mtp_loss_by_hand(targets, soft):
    target = targets["llama"]
    model = make("mtp", target).model
    batch = train_batch(target, (0,))
    n = batch.input_ids.shape[1]
    with torch.no_grad():
        out = model.loss(batch, torch.Generator(), soft=soft)
        h, _ = model(batch.final, shift_left(batch.input_ids, 1), torch.arange(n).expand(len(batch.final), n), None,
                     ttt_mask(batch.attention, 0))
        logq = torch.log_softmax(target.lm_head(model.norm(h)), -1)[:, : n - 2]  # predicts y_{t+2}
        pi = torch.softmax(target.lm_head(batch.final), -1)[:, 1 : n - 1]
    if soft:
        ce = -(pi * logq).sum(-1)
    else:
        ce = -logq.gather(-1, batch.input_ids[:, 2:, None]).squeeze(-1)
    valid = batch.loss_mask[:, 2:]
    assert out.loss.item() == pytest.approx(float(ce[valid].mean()), rel=1e-5)
    accept = 1 - 0.5 * (logq.exp() - pi).abs().sum(-1)
    assert out.acceptance.item() == pytest.approx(float(accept[valid].mean()), rel=1e-5)


@pytest.mark.parametrize("name,options", [("eagle3", {"ttt_length": 3}), ("mtp", {"soft": True}), ("mtp", {})])
def test_training_lowers_loss_and_raises_acceptance(targets, name, options):
    """30 Adam steps on 3 batches of random sequences. The soft losses have a floor at the target's entropy
    (~4.0 nats here, from ~5.0 at init). Hard-label MTP on random (not target-sampled) tokens memorises them,
    so only its loss is checked: its acceptance against pi is expected to fall."""
    target = targets["qwen3"]
    model = make(name, target).model.train()
    batches = [train_batch(target, model.taps if name == "eagle3" else (0,), seed=s) for s in range(3)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = [model.loss(b, None, **options) for b in batches]
    for step in range(30):
        out = model.loss(batches[step % 3], None, **options)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    with torch.no_grad():
        after = [model.loss(b, None, **options) for b in batches]
    assert sum(a.loss.item() for a in after) < 0.9 * sum(b.loss.item() for b in before)
    gain = sum(a.acceptance.mean().item() - b.acceptance.mean().item() for a, b in zip(after, before, strict=True))
    assert gain / 3 > 0.1 or options == {}
    assert all(p.grad is None for p in target.model.parameters())


# ---- inference -----------------------------------------------------------------------------------------------
def started_slot(drafter, target, prompt, seed: int = 0) -> Slot:
    _, out = target.prefill([prompt], drafter.feature_layers)
    first = int(out.logits[0, -1].argmax())
    slot = Slot(0, [*prompt, first], len(prompt), seed, out.features[0])
    drafter.begin(DraftContext(target, 1.0, 2), [slot])
    return slot


@pytest.mark.parametrize("name", ["eagle3", "mtp"])
def test_q_is_the_sampled_distribution(targets, name):
    """500 slots sharing one state draw the first token (and the second given the most common first) from q."""
    target = targets["llama"]
    drafter = make(name, target, **({"depth": 2} if name == "mtp" else {}))
    base = started_slot(drafter, target, random_prompts(1, seed=3)[0])
    firsts, seconds, q1, q2 = [], {}, None, {}
    for rep in range(6):  # draws are keyed by seed: new seeds each time, so the 3000 draws are independent
        slots = [Slot(i, base.tokens, base.prompt_len, 500 * rep + i, state=base.state) for i in range(500)]
        ctx = DraftContext(target, 0.8, 2, slots)
        p = drafter.propose(ctx)
        assert torch.allclose(p.q[:, 0].sum(-1), torch.ones(1)) and (p.lengths >= 1).all()
        q1 = p.q[0, 0] if q1 is None else q1
        assert torch.equal(p.q[:, 0], q1.expand_as(p.q[:, 0]))  # identical state -> identical law
        for r in range(len(slots)):
            x1 = int(p.tokens[r, 0])
            firsts.append(x1)
            if p.lengths[r] > 1:
                seconds.setdefault(x1, []).append(int(p.tokens[r, 1]))
                q2[x1] = p.q[r, 1]
    assert chi2_pvalue(firsts, q1) > 1e-3
    mode = max(seconds, key=lambda x: len(seconds[x]))
    assert chi2_pvalue(seconds[mode], q2[mode]) > 1e-3


def chi2_pvalue(draws: list[int], q: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(draws), minlength=q.shape[0]).double()
    expected = q.double() * len(draws)
    assert counts[expected == 0].sum() == 0, "drew a token of probability 0"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    return float(chisquare(obs[keep].numpy(), exp[keep].numpy() * obs.sum().item() / exp[keep].sum().item()).pvalue)


def random_rule(seed: int):
    """A batched acceptance rule that accepts a random prefix (to exercise multi-token cache extension)."""
    rng = torch.Generator().manual_seed(seed)

    def rule(p, draft, q, lengths, draws, eos_ids):
        accepted = (torch.rand(lengths.shape, generator=rng) * (lengths + 1)).long().clamp(max=lengths)
        stop, accepted = eos_stop(draft, accepted, eos_ids)
        token = p.gather(1, accepted.view(-1, 1, 1).expand(-1, 1, p.shape[-1])).squeeze(1).argmax(-1)
        return Verdicts(accepted, torch.where(stop, torch.full_like(token, -1), token), stop)

    return rule


def from_scratch(model, target, taps, tokens: list[int]):
    """Output hidden + KV after feeding all pairs (features_t, y_{t+1}) of ``tokens`` at once."""
    _, out = target.prefill([tokens[:-1]], taps)
    f, n = out.features[0], len(tokens) - 1
    hidden = model.context(f.layers, f.final)[None]
    return model(hidden, torch.tensor([tokens[1:]]), torch.arange(n)[None], None, attention_mask(no_past(), n))


@pytest.mark.parametrize("name,arch", [("eagle3", "qwen3"), ("mtp", "llama")])
def test_incremental_cache_equals_from_scratch(targets, name, arch):
    """After every commit (random acceptance, R up to 3, joins/leaves), the cache and the next-token logits
    equal a from-scratch forward over the whole committed sequence."""
    target = targets[arch]
    drafter = make(name, target, **({"depth": 3} if name == "mtp" else {}))
    checked = []

    def check(ctx, slots, verdicts):
        original_commit(ctx, slots, verdicts)
        for slot in slots:
            state: ChainState = slot.state
            with torch.no_grad():
                out, (k, v) = from_scratch(drafter.model, target, drafter.feature_layers, slot.tokens[: state.length + 1])
            torch.testing.assert_close(state.kv[0], k[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(state.hidden, out[0, -1], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(drafter.model.logits(state.hidden), drafter.model.logits(out[0, -1]),
                                       atol=1e-3, rtol=1e-4)
            checked.append(len(verdicts))

    original_commit, drafter.commit = drafter.commit, check
    engine = RoundLoop(target, drafter, EngineConfig(max_new_tokens=16, temperature=1.0, block_size=4, concurrency=3),
                    accept=random_rule(1))
    results = []
    engine.run([Request(i, tuple(p), seed=i) for i, p in enumerate(random_prompts(5, seed=7))], results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert 3 in checked and any(s.accepted > 1 for r in results for s in r.rounds)


@pytest.mark.parametrize("name,options", [("eagle3", {}), ("mtp", {}), ("mtp", {"depth": 3})])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("concurrency", [1, 3])
def test_greedy_output_equals_vanilla(targets, name, options, arch, concurrency):
    from dspark_bench.drafters.vanilla import NoDraft

    target = targets[arch]
    requests = [Request(i, tuple(p), seed=i) for i, p in enumerate(random_prompts(4, seed=11))]
    outputs = {}
    for key, drafter in (("draft", make(name, target, **options)), ("none", NoDraft(NoDraft.Config(), target))):
        results = []
        RoundLoop(target, drafter, EngineConfig(max_new_tokens=24, temperature=0.0, block_size=5,
                                             concurrency=concurrency)).run(requests, results.append)
        outputs[key] = {r.request.request_id: (r.status, r.output_ids) for r in results}
        if key == "draft":
            proposed = [s.proposed for r in results for s in r.rounds]
            assert max(proposed) == (options.get("depth", 1) if name == "mtp" else 5)
    assert outputs["draft"] == outputs["none"]


def test_chain_drafts_through_eos_and_the_verifier_stops_there(targets):
    """The chain proposes its whole block with no host sync to look for EOS; an accepted EOS ends the request
    in the verifier, so nothing drafted after it is ever emitted."""
    target = targets["llama"]
    drafter = make("eagle3", target)
    slot = started_slot(drafter, target, random_prompts(1, seed=2)[0])
    with torch.no_grad():  # make EOS certain
        bias = torch.zeros(target.vocab_size)
        bias[TINY_EOS] = 1e4
        target.model.get_output_embeddings().bias = torch.nn.Parameter(bias, requires_grad=False)
    try:
        p = drafter.propose(DraftContext(target, 1.0, 5, [slot]))
    finally:
        target.model.get_output_embeddings().bias = None
    assert p.lengths.tolist() == [5] and p.tokens[0, 0].item() == TINY_EOS
    probs = torch.zeros(1, 6, target.vocab_size)
    probs[..., TINY_EOS] = 1.0  # a target as sure of EOS as the drafter
    v = speculative_accept(probs, p.tokens, p.q, p.lengths, Draws(torch.full((1, 5), 0.5, dtype=torch.float64),
                                                                  torch.full((1,), 0.5, dtype=torch.float64)),
                           torch.tensor([TINY_EOS]))
    assert v.to_host() == [Verdict(1, None, eos=True)]


# ---- configs and checkpoints ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["eagle3", "mtp"])
def test_save_load_bit_exact_and_target_checked(targets, name, tmp_path):
    target = targets["qwen3"]
    model = make(name, target, seed=3).model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.01)
    model.save(tmp_path / "ck")
    saved = set(json.loads((tmp_path / "ck" / "config.json").read_text())["config"])
    assert saved == ({"layer", "taps"} if name == "eagle3" else {"layer"})
    loaded = make(name, target, checkpoint=str(tmp_path / "ck")).model
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not any("embed" in k or "lm_head" in k for k in mine)
    with pytest.raises(CheckpointError, match="trained for target"):
        make(name, tiny_target("qwen3", seed=1), checkpoint=str(tmp_path / "ck"))
    other = "mtp" if name == "eagle3" else "eagle3"
    with pytest.raises(CheckpointError, match="not"):
        make(other, target, checkpoint=str(tmp_path / "ck"))


def test_random_init_is_seeded_and_leaves_global_rng_alone(targets, caplog):
    target = targets["llama"]
    state = torch.random.get_rng_state()
    a, b = make("mtp", target, seed=4).model, make("mtp", target, seed=4).model
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(make("mtp", target, seed=5).model.eh_proj.weight, a.eh_proj.weight)
    assert "random weights" in caplog.text


def test_eagle3_taps_option_and_shipped_checkpoint(targets, tmp_path, monkeypatch):
    target = targets["llama"]
    assert make("eagle3", target, taps="0,2,4").feature_layers == (0, 2, 4)
    with pytest.raises(DrafterError, match="last layer"):
        make("eagle3", target, taps=(1, 5))
    from dspark_bench.drafters import blockdraft

    model = make("eagle3", target, taps=(1, 3), seed=9).model
    model.save(tmp_path / "drafters" / target.name / "eagle3")
    real = blockdraft.shipped
    monkeypatch.setattr(blockdraft, "shipped", lambda m, t: real(m, t, root=tmp_path / "drafters"))
    shipped = make("eagle3", target)
    assert shipped.feature_layers == (1, 3) and torch.equal(shipped.model.fc.weight, model.fc.weight)
    with pytest.raises(DrafterError, match="conflict"):
        make("eagle3", target, taps=(1, 2))


# ---- DeepSeek's released Eagle3 format -----------------------------------------------------------------------
def write_deepseek_eagle3(folder, target, **overrides):
    """A tiny checkpoint in DeepSeek's exact format (names and shapes written out from the format doc)."""
    from safetensors.torch import save_file

    d, i, h, kv, hd = 64, 128, 4, 2, 16
    shapes = {
        "fc.weight": (d, 5 * d), "norm.weight": (d,),
        "layers.0.self_attn.q_proj.weight": (h * hd, 2 * d), "layers.0.self_attn.k_proj.weight": (kv * hd, 2 * d),
        "layers.0.self_attn.v_proj.weight": (kv * hd, 2 * d), "layers.0.self_attn.o_proj.weight": (d, h * hd),
        "layers.0.self_attn.q_norm.weight": (hd,), "layers.0.self_attn.k_norm.weight": (hd,),
        "layers.0.mlp.gate_proj.weight": (i, d), "layers.0.mlp.up_proj.weight": (i, d),
        "layers.0.mlp.down_proj.weight": (d, i), "layers.0.hidden_norm.weight": (d,),
        "layers.0.input_layernorm.weight": (d,), "layers.0.post_attention_layernorm.weight": (d,),
    }
    gen = torch.Generator().manual_seed(1)
    tensors = {k: (1 + 0.1 * torch.randn(s, generator=gen)) if len(s) == 1 else 0.05 * torch.randn(s, generator=gen)
               for k, s in shapes.items()}
    tensors["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    tensors["lm_head.weight"] = target.model.get_output_embeddings().weight.detach().clone()
    config = target.config.to_dict()
    config.update(architectures=["Qwen3Eagle3Model"], num_target_layers=target.num_layers, num_hidden_layers=1,
                  draft_num_hidden_layers=1, layer_types=["full_attention"], target_model_name_or_path="tiny",
                  target_layer_ids=[0, 1, 2, 3, 4], ttt_length=7, step_loss_decay=0.8, tie_word_embeddings=False,
                  dtype="bfloat16", _attn_implementation="flex_attention")
    config.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in tensors.items()}, str(folder / "model.safetensors"))
    return tensors


def reference_eagle3_first_hidden(t, target, taps_features, tokens):
    """Independent Qwen3Eagle3 layer forward from the format doc (HF rotary), for positions 0..n-1."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

    def rms(x, w, eps=target.config.rms_norm_eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    w = {k: v.float() for k, v in t.items()}
    p = "layers.0."
    n = tokens.shape[0]
    g = taps_features.flatten(-2) @ w["fc.weight"].T  # [n, d]
    emb = target.model.get_input_embeddings().weight[tokens]  # the draft's copy is bf16; the fp32 target's is used
    u = torch.cat([rms(emb, w[p + "input_layernorm.weight"]),
                   rms(g, w[p + "hidden_norm.weight"])], -1)
    q = rms((u @ w[p + "self_attn.q_proj.weight"].T).view(n, 4, 16), w[p + "self_attn.q_norm.weight"]).transpose(0, 1)
    k = rms((u @ w[p + "self_attn.k_proj.weight"].T).view(n, 2, 16), w[p + "self_attn.k_norm.weight"]).transpose(0, 1)
    val = (u @ w[p + "self_attn.v_proj.weight"].T).view(n, 2, 16).transpose(0, 1)
    cos, sin = Qwen3RotaryEmbedding(target.config)(val, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    k, val = k[0].repeat_interleave(2, 0), val.repeat_interleave(2, 0)
    scores = (q[0] @ k.transpose(-1, -2)) / 4.0 + torch.full((n, n), float("-inf")).triu(1)
    attn = (scores.softmax(-1) @ val).transpose(0, 1).reshape(n, 64) @ w[p + "self_attn.o_proj.weight"].T
    h = g + attn
    x = rms(h, w[p + "post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T))
    return h + mlp @ w[p + "mlp.down_proj.weight"].T


def test_deepseek_eagle3_checkpoint_loads(targets, tmp_path):
    target = targets["qwen3"]
    tensors = write_deepseek_eagle3(tmp_path / "ds", target)
    drafter = make("eagle3", target, checkpoint=str(tmp_path / "ds"))
    assert drafter.feature_layers == (0, 1, 2, 3, 4)
    model = drafter.model
    assert torch.equal(model.fc.weight, tensors["fc.weight"].to(torch.bfloat16).float())
    prompt = random_prompts(1, seed=4, min_len=8, max_len=8)[0]
    _, out = target.prefill([prompt], drafter.feature_layers)
    tokens = torch.tensor(prompt[1:] + [5])
    with torch.no_grad():
        got, _ = model(model.context(out.features[0].layers, None)[None], tokens[None], torch.arange(8)[None], None,
                       attention_mask(no_past(), 8))
        bf16 = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        want = reference_eagle3_first_hidden(bf16, target, out.features[0].layers, tokens)
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overrides,message", [
    ({"vocab_size": 100}, "vocab_size is 100"),
    ({"hidden_size": 32}, "hidden_size is 32"),
    ({"target_layer_ids": [0, 1, 2, 3, 5]}, "last layer"),
    ({"target_layer_ids": [0, 1, 2, 3]}, "exactly 5"),
    ({"draft_num_hidden_layers": 2}, "exactly 1"),
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, "RoPE base"),
    ({"architectures": ["Gemma4Eagle3Model"]}, "not a supported"),
])
def test_deepseek_eagle3_mismatch_errors(targets, tmp_path, overrides, message):
    target = targets["qwen3"]
    write_deepseek_eagle3(tmp_path / "ds", target, **overrides)
    with pytest.raises(CheckpointError, match=message):
        deepseek_eagle3.load(tmp_path / "ds", target)


def test_deepseek_eagle3_wrong_names_or_frozen_copies(targets, tmp_path):
    from safetensors.torch import load_file, save_file

    target = targets["qwen3"]
    write_deepseek_eagle3(tmp_path / "ds", target)
    path = tmp_path / "ds" / "model.safetensors"
    state = load_file(str(path))
    renamed = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    save_file(renamed, str(path))
    with pytest.raises(CheckpointError, match="missing"):
        deepseek_eagle3.load(tmp_path / "ds", target)
    state["lm_head.weight"] = state["lm_head.weight"] * 2
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        deepseek_eagle3.load(tmp_path / "ds", target)
    with pytest.raises(CheckpointError, match="differs from the target"):
        deepseek_eagle3.load(tmp_path / "ds", tiny_target("qwen3", seed=1))

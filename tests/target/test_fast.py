"""The fast forward path (target/fast.py) against transformers' own forward, on the same batched cache.

Both paths run over one model (the fast path's fused matrices; the HF modules read views of them), so every
difference below is the forward's arithmetic, never the weights. fp32 throughout: the paths must agree to ~1e-5
relative on prefill, decode and verify blocks, with holes after rejections, after compaction, after a drop and a
merge, on the tapped layers too, and greedy decoding must give the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_prompts

from dspark_bench import drafters
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.target.fast import PACK_MAX_ROWS, KVCache, Linear, arch_of, onednn_packs
from dspark_bench.target.model import Target, TargetError, resolve_forward_path

pytestmark = pytest.mark.usefixtures("one_thread")
RTOL = 1e-5
TAPS = (-1, 1, 3)


FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _llama(seed: int = 0, family: str = "llama", **extra) -> torch.nn.Module:
    """A random-weight model of ``family`` with grouped-query attention (4 query heads on 2 KV heads), biases where
    the family has them or where asked (Qwen2's Q/K/V biases; Qwen3's per-head query and key norms)."""
    import transformers

    kinds = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    config_class = getattr(transformers, f"{kinds[family]}Config")
    model_class = getattr(transformers, f"{kinds[family]}ForCausalLM")
    if family != "llama":
        extra = {"sliding_window": None, "head_dim": 16, **extra}
    torch.manual_seed(seed)
    config = config_class(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          rope_theta=500.0, eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
                          **extra)
    model = model_class(config).float()
    with torch.no_grad():  # random norm weights and biases, so that one applied wrongly or not at all shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    model.config._attn_implementation = "sdpa"
    return model


def _pair(model) -> tuple[Target, Target]:
    fast = Target(model, None, "tiny-llama", forward_path="fast")
    return fast, Target(model, None, "tiny-llama", forward_path="hf")


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    scale = b.abs().max().clamp_min(1e-6)
    assert float((a - b).abs().max() / scale) < RTOL, float((a - b).abs().max() / scale)


def _same_step(fast_out, hf_out, lengths=None) -> None:
    """Logits of the real slots, the tapped layers and the final hidden states agree."""
    for r, (f, h) in enumerate(zip(fast_out.features, hf_out.features, strict=True)):
        n = len(h) if lengths is None else lengths[r]
        _close(fast_out.logits[r, :n], hf_out.logits[r, :n])
        _close(f.layers, h.layers)
        _close(f.final, h.final)


@pytest.mark.parametrize(("family", "extra"), [("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
                                               *((f, {}) for f in FAMILIES[1:])])
def test_rounds_with_holes_compaction_drop_and_merge_match_hf(family, extra):
    """Three rows of different prompt lengths (left pads), verify blocks of different lengths with rejections
    (holes), decode steps, a compaction, a drop and a newcomer merged in: logits and taps agree at every step, for
    every family the fast path runs."""
    model = _llama(family=family, **extra)
    assert Target(model, None, "tiny", forward_path="auto").forward_path == "fast"
    fast, hf = _pair(model)
    prompts = random_prompts(3, seed=1)
    (fb, fo), (hb, ho) = fast.prefill(prompts, TAPS), hf.prefill(prompts, TAPS)
    _same_step(fo, ho)
    gen = torch.Generator().manual_seed(0)
    for step in range(8):
        width = 1 if step % 3 == 2 else 5  # decode steps between verify blocks
        lengths = [width] * fb.rows if width == 1 else [5, 2, 4][: fb.rows]
        ids = torch.randint(3, 96, (fb.rows, width), generator=gen)
        _same_step(fast.forward_block(fb, ids, lengths, TAPS), hf.forward_block(hb, ids, lengths, TAPS), lengths)
        kept = [1 + (step + r) % n for r, n in enumerate(lengths)]  # rejections leave holes
        fast.keep(fb, kept), hf.keep(hb, kept)
        if step == 3:
            fast.compact(fb, 0), hf.compact(hb, 0)
        if step == 5:
            fast.drop(fb, [1]), hf.drop(hb, [1])
            newcomer = random_prompts(1, seed=9)
            fast.merge(fb, fast.prefill(newcomer)[0]), hf.merge(hb, hf.prefill(newcomer)[0])
        assert np.array_equal(fb.mask, hb.mask)
    assert not fb.mask.all()  # the last steps really ran over holes


def test_unpadded_rows_take_the_causal_mask_without_a_bias():
    """Rows of equal length with no hole: the prefill uses SDPA's causal mask, a decode step none, a verify block
    the causal bias the fast path builds itself; all as HF's own mask gives."""
    fast, hf = _pair(_llama(seed=1))
    prompts = [p[:12] for p in random_prompts(2, seed=3, min_len=12)]
    (fb, fo), (hb, ho) = fast.prefill(prompts, TAPS), hf.prefill(prompts, TAPS)
    _same_step(fo, ho)
    for width in (1, 4, 1):
        ids = torch.randint(3, 96, (2, width))
        _same_step(fast.forward_block(fb, ids, [width] * 2, TAPS), hf.forward_block(hb, ids, [width] * 2, TAPS))
        fast.keep(fb, [width] * 2), hf.keep(hb, [width] * 2)
        assert fb.mask.all()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_prompts_prefilled_end_to_end_agree_with_the_hf_path_and_decode_on(family):
    """The fast path prefills several prompts in one row without pads (lengths 1 to 19 here, one of them twice):
    logits, taps, mask, positions and every later block agree with the HF path's padded prefill."""
    fast, hf = _pair(_llama(seed=7, family=family))
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (7, 1, 19, 7, 12)]
    (fb, fo), (hb, ho) = fast.prefill(prompts, TAPS), hf.prefill(prompts, TAPS)
    assert fo.logits.shape == ho.logits.shape == (5, 1, 96)
    _same_step(fo, ho)
    assert [len(f) for f in fo.features] == [len(p) for p in prompts]
    assert np.array_equal(fb.mask, hb.mask) and torch.equal(fb.next_pos, hb.next_pos)
    assert fb.block_lens == hb.block_lens == [len(p) for p in prompts]
    for width, kept in ((3, [1, 3, 2, 3, 1]), (1, [1] * 5), (4, [4] * 5)):
        ids = torch.randint(3, 96, (5, width), generator=gen)
        _same_step(fast.forward_block(fb, ids, [width] * 5, TAPS), hf.forward_block(hb, ids, [width] * 5, TAPS))
        fast.keep(fb, kept), hf.keep(hb, kept)
    assert fb.lens == hb.lens


def test_the_fast_grouped_path_prefills_in_padded_groups_with_the_same_result(monkeypatch):
    model = _llama(seed=9)
    fast = Target(model, None, "tiny-llama", forward_path="fast")
    grouped = Target(model, None, "tiny-llama", forward_path="fast-grouped")
    assert grouped.linear_kernel == fast.linear_kernel
    flat_calls = []
    original = Target._prefill_flat
    monkeypatch.setattr(Target, "_prefill_flat", lambda self, p, t: flat_calls.append(self.forward_path)
                        or original(self, p, t))
    prompts = random_prompts(3, seed=2)
    assert len(set(map(len, prompts))) == 3
    (fb, fo), (gb, go) = fast.prefill(prompts, TAPS), grouped.prefill(prompts, TAPS)
    assert flat_calls == ["fast"]
    _same_step(fo, go)
    assert np.array_equal(fb.mask, gb.mask) and torch.equal(fb.next_pos, gb.next_pos)
    fast.prefill([prompts[0], prompts[0]])  # one length: one padded forward, no pads
    assert flat_calls == ["fast"]


def test_long_blocks_and_padded_prefills_take_the_unpacked_path():
    """Blocks wider than PACK_ROWS (a padded prefill of long prompts, a wide verify block over holes) run SDPA's
    grouped-query path under the unpacked bias; they agree with HF too."""
    from dspark_bench.target.fast import PACK_ROWS

    fast, hf = _pair(_llama(seed=4))
    prompts = random_prompts(2, seed=6, min_len=PACK_ROWS + 2, max_len=PACK_ROWS + 12)
    assert len(set(map(len, prompts))) == 2  # pads
    (fb, fo), (hb, ho) = fast.prefill(prompts, TAPS), hf.prefill(prompts, TAPS)
    _same_step(fo, ho)
    width = PACK_ROWS + 3
    ids = torch.randint(3, 96, (2, width), generator=torch.Generator().manual_seed(1))
    lengths = [width, 6]
    _same_step(fast.forward_block(fb, ids, lengths, TAPS), hf.forward_block(hb, ids, lengths, TAPS), lengths)
    fast.keep(fb, [3, 2]), hf.keep(hb, [3, 2])
    _same_step(fast.forward_block(fb, ids, lengths, TAPS), hf.forward_block(hb, ids, lengths, TAPS), lengths)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_decoding_gives_the_same_tokens_on_both_paths(family):
    fast, hf = _pair(_llama(seed=2, family=family))
    reqs = [Request(i, tuple(p), 100 + i) for i, p in enumerate(random_prompts(4, seed=4))]
    outputs = {}
    for name, target in (("fast", fast), ("hf", hf)):
        for drafter in ("none", "ngram"):
            results = []
            config = EngineConfig(max_new_tokens=24, temperature=0.0, block_size=4, concurrency=3)
            RoundLoop(target, drafters.create(drafter, target), config).run(reqs, results.append)
            outputs[name, drafter] = {r.request.request_id: r.output_ids for r in results}
    assert outputs["fast", "none"] == outputs["hf", "none"] == outputs["fast", "ngram"]
    assert sum(map(len, outputs["fast", "none"].values())) > 40


def test_decode_steps_append_in_place():
    """Within the buffer's spare columns, decode steps write K/V in place (no copy of the cache per step); a
    drop replaces the tensors and the next append makes a new buffer that holds the same columns."""
    fast, _ = _pair(_llama(seed=3))
    batch, _ = fast.prefill(random_prompts(2, seed=5))
    assert isinstance(batch.cache, KVCache)
    layer = batch.cache.layers[0]
    fast.forward_block(batch, torch.tensor([[5], [6]]), [1, 1])
    fast.keep(batch, [1, 1])
    start = layer.keys.data_ptr()
    for token in range(7, 12):
        fast.forward_block(batch, torch.tensor([[token], [token]]), [1, 1])
        fast.keep(batch, [1, 1])
        assert layer.keys.data_ptr() == start
    before = layer.keys[1].clone()
    fast.drop(batch, [0])
    fast.forward_block(batch, torch.tensor([[12]]), [1])
    assert layer.keys.data_ptr() != start
    assert torch.equal(layer.keys[0, :, : before.shape[1]], before[:, : layer.keys.shape[2] - 1])


def test_forward_path_choice():
    """auto: fast for the Llama family with full attention, hf for anything else (a sliding window, a rope that
    changes with the length, another activation or architecture); fast is refused where it cannot run; an unknown
    name is refused with the accepted ones."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    assert resolve_forward_path("auto", LlamaConfig()) == "fast"
    assert resolve_forward_path("hf", LlamaConfig()) == "hf"
    assert resolve_forward_path("auto", Qwen3Config()) == "fast" and arch_of(Qwen3Config()).qk_norm
    assert resolve_forward_path("auto", Qwen2Config()) == "fast" and not arch_of(Qwen2Config()).qk_norm
    assert resolve_forward_path("auto", MistralConfig(sliding_window=None)) == "fast"
    assert resolve_forward_path("auto", MistralConfig(sliding_window=4096)) == "hf"
    assert resolve_forward_path("auto", Qwen3Config(use_sliding_window=True, max_window_layers=1)) == "hf"
    assert resolve_forward_path("auto", LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0})) == "hf"
    assert resolve_forward_path("auto", LlamaConfig(hidden_act="gelu")) == "hf"
    assert arch_of(Gemma2Config()) is None
    with pytest.raises(TargetError, match="'fast' runs llama, mistral, qwen2, qwen3 targets .* not this 'gemma2'"):
        resolve_forward_path("fast", Gemma2Config())
    with pytest.raises(TargetError, match="'fast-unpacked' runs llama"):
        resolve_forward_path("fast-unpacked", MistralConfig(sliding_window=4096))
    assert resolve_forward_path("fast-unpacked", LlamaConfig()) == "fast-unpacked"
    assert resolve_forward_path("fast-sdpa", LlamaConfig()) == "fast-sdpa"
    with pytest.raises(TargetError, match="accepted: auto, fast, fast-unpacked, fast-grouped, fast-sdpa, hf"):
        resolve_forward_path("turbo", LlamaConfig())
    with pytest.raises(TargetError, match="accepted: auto, fast, fast-unpacked, fast-grouped, fast-sdpa, hf"):
        Target.load("no-such-target", dtype="fp32", forward_path="turbo")  # refused before any loading


@pytest.mark.integration
def test_embedded_target_matches_hf_in_fp32():
    """SmolLM2-135M in fp32: prefill, verify blocks with rejections, a compaction and decode steps agree with the
    HF path (logits and taps), and greedy `none` gives the same tokens on real prompts."""
    from dspark_bench.evaluation.suites import load_suite

    loaded = Target.load("smollm2-135m", dtype="fp32", forward_path="fast")
    fast, hf = loaded, Target(loaded.model, loaded.tokenizer, loaded.name, forward_path="hf")
    prompts = [fast.render(p.text) for p in load_suite("gsm8k,humaneval,chat", limit=1)]
    taps = (2, 15, 27)
    (fb, fo), (hb, ho) = fast.prefill(prompts, taps), hf.prefill(prompts, taps)
    _same_step(fo, ho)
    for step, width in enumerate((6, 6, 1, 6)):
        lengths = [width, max(1, width - 3), width]
        ids = torch.randint(20, 40000, (3, width), generator=torch.Generator().manual_seed(step))
        _same_step(fast.forward_block(fb, ids, lengths, taps), hf.forward_block(hb, ids, lengths, taps), lengths)
        fast.keep(fb, [1, 1, lengths[2]]), hf.keep(hb, [1, 1, lengths[2]])
        if step == 1:
            fast.compact(fb, 0), hf.compact(hb, 0)
    reqs = [Request(i, tuple(p), 980406 + i) for i, p in enumerate(prompts)]
    outputs = []
    for target in (fast, hf):
        results = []
        RoundLoop(target, drafters.create("none", target), EngineConfig(max_new_tokens=32, temperature=0.0,
                                                                         concurrency=3)).run(reqs, results.append)
        outputs.append({r.request.request_id: r.output_ids for r in results})
    assert outputs[0] == outputs[1] and all(len(o) >= 8 for o in outputs[0].values())


@pytest.mark.parametrize(("arch", "path"), [("llama", "fast"), ("qwen3", "fast"), ("qwen3", "hf")])
def test_manifest_records_the_forward_path_that_ran(tmp_path, monkeypatch, arch, path):
    from conftest import tiny_target

    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.native.runner import Run
    from dspark_bench.evaluation.runs import read_manifest
    from dspark_bench.evaluation.suites import Prompt

    target = tiny_target(arch, forward_path="auto" if path == "fast" else path)
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    prompts = [Prompt("ds", "custom", "p0", 0, "prompt xyz")]
    Run(RunSpec(target="tiny", drafters=("none",), max_new_tokens=4, warmup=False), target, prompts,
        tmp_path / "run").execute()
    recorded = read_manifest(tmp_path / "run")["target"]
    assert recorded["forward_path"] == path
    assert recorded["linear_kernel"] == {"fast": "onednn-packed", "hf": "hf"}[path]
    assert recorded["attention_kernel"] == target.attention_kernel
    assert (recorded["attention_kernel"] == "hf") == (path == "hf")


@pytest.mark.skipif(not onednn_packs(torch.float32, torch.device("cpu")), reason="this torch has no oneDNN")
def test_products_of_one_to_512_rows_read_the_packed_weight():
    """Routing: a product of at most PACK_MAX_ROWS rows (one row included) reads the packed copy, more rows the
    weight as it is (a packed copy of another weight shows which one ran); both give the product to fp32's rounding,
    in any leading shape; a product autograd records takes F.linear (the packed product has no backward)."""
    torch.manual_seed(0)
    weight, other, bias = torch.randn(48, 32), torch.randn(48, 32), torch.randn(48)
    linear = Linear(weight, bias, packed=True)
    for shape in ((1, 32), (2, 1, 32), (3, 32), (2, 5, 32), (3, 16, 32), (PACK_MAX_ROWS + 1, 32)):
        x = torch.randn(shape)
        torch.testing.assert_close(linear(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    swapped = Linear(weight, bias, packed=True)
    swapped.packed = Linear(other, None, packed=True).packed
    for one in (torch.randn(1, 32), torch.randn(1, 1, 32), torch.randn(2, 32)):  # a decode step, an MTP verify
        torch.testing.assert_close(swapped(one), F.linear(one, other, bias), rtol=1e-5, atol=1e-5)
    most, too_many = torch.randn(2, PACK_MAX_ROWS // 2, 32), torch.randn(PACK_MAX_ROWS + 1, 32)
    torch.testing.assert_close(swapped(most), F.linear(most, other, bias), rtol=1e-5, atol=1e-5)
    assert torch.equal(swapped(too_many), F.linear(too_many, weight, bias))
    trained = torch.randn(8, 32, requires_grad=True)
    swapped(trained).sum().backward()  # F.linear with the real weight: the packed copy of `other` is not read
    torch.testing.assert_close(trained.grad, weight.sum(0).expand(8, 32))
    assert Linear(weight, bias, packed=False).packed is None


def test_packing_is_for_the_cpu_in_fp32_and_bf16():
    assert not onednn_packs(torch.float16, torch.device("cpu"))
    assert not onednn_packs(torch.float32, torch.device("meta"))
    fast, hf = _pair(_llama(seed=6))
    expected = "onednn-packed" if onednn_packs(torch.float32, torch.device("cpu")) else "torch"
    assert (fast.linear_kernel, hf.linear_kernel) == (expected, "hf")
    assert Target(fast.model, None, "tiny-llama", forward_path="fast-unpacked").linear_kernel == "torch"
    if onednn_packs(torch.bfloat16, torch.device("cpu")):  # oneDNN takes bf16 on this CPU: the same product
        weight, x = torch.randn(48, 32).bfloat16(), torch.randn(3, 8, 32).bfloat16()
        torch.testing.assert_close(Linear(weight, None, packed=True)(x), F.linear(x, weight), rtol=2e-2, atol=2e-2)

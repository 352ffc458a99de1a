"""Our CPU attention kernel for decode steps (target/cpu_attention.cpp, built by target/kernels.py) against SDPA,
and where the fast path uses it.

The kernel computes in float32 whatever the inputs, so in fp32 it must agree with SDPA to float32's rounding and in
bf16 with SDPA in float32 as closely as SDPA in bf16 does; a masked column (the dtype's lowest bias) must get no
weight at all, whatever its K/V hold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark_bench.target import kernels
from dspark_bench.target.fast import Attend, attention
from dspark_bench.target.model import default_cache_dir

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def decode():
    kernel = kernels.decode_attention(default_cache_dir())
    if kernel is None:  # the reason is part of the skip message (-rs)
        pytest.skip(f"the CPU attention kernel is unavailable here: {kernels.unavailable_reason()}")
    return kernel


def _case(rows, groups, columns, dim, dtype, bias_rows, seed=0, spare=7):
    """q [R, 3, G, D] contiguous; k, v views [R, 3, S, D] of buffers with spare columns (as the cache holds them);
    bias [bias_rows, 1, G, S] with two masked columns per row (when S > 3), or None."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, 3, groups, dim, generator=g).to(dtype)
    k, v = (torch.randn(rows, 3, columns + spare, dim, generator=g).to(dtype)[:, :, :columns] for _ in range(2))
    bias = None
    if bias_rows:
        bias = torch.zeros(bias_rows, 1, groups, columns, dtype=dtype)
        if columns > 3:
            bias[..., 1:3] = torch.finfo(dtype).min
    return q, k, v, bias


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "groups", "columns", "dim", "bias_rows"), [
    (1, 3, 1, 64, 0), (1, 3, 200, 64, 0), (4, 3, 17, 64, "R"), (3, 1, 33, 16, 1), (2, 5, 1003, 128, "R"),
    (5, 4, 16, 32, 1), (2, 24, 40, 64, "R"),
])
def test_the_kernel_agrees_with_sdpa(decode, dtype, rows, groups, columns, dim, bias_rows):
    q, k, v, bias = _case(rows, groups, columns, dim, dtype, rows if bias_rows == "R" else bias_rows)
    scale = dim**-0.5
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                           attn_mask=None if bias is None else bias.double())
    got = decode(q, k, v, bias, scale)
    assert got.dtype == dtype and got.shape == q.shape
    if dtype == torch.float32:
        assert _relative(got, exact) < 2e-6
    else:  # bf16 inputs, float32 arithmetic, one rounding of the output: as close as SDPA's own bf16 result
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        assert _relative(got, exact) <= max(2 * _relative(sdpa, exact), 8e-3)


def test_a_masked_column_gets_no_weight(decode):
    """Huge values in a masked column's K and V change nothing: its weight is exactly 0 (not e^-87)."""
    q, k, v, bias = _case(2, 3, 12, 64, torch.float32, 2)
    clean = decode(q, k, v, bias, 0.125)
    k[:, :, 1:3], v[:, :, 1:3] = 1e4, 1e30
    assert torch.equal(decode(q, k, v, bias, 0.125), clean)


def test_bad_input_is_refused_with_a_reason(decode):
    q, k, v, _ = _case(2, 3, 8, 64, torch.float32, 0)
    for args, message in [((q[..., :40].contiguous(), k[..., :40], v[..., :40]), "multiple of 16"),
                          ((q.transpose(2, 3), k, v), "contiguous"),
                          ((q.double(), k.double(), v.double()), "float32 or bfloat16"),
                          ((q, k.bfloat16(), v), "one dtype"),
                          ((q, k[:1], v[:1]), "k, v"),
                          ((q, k.transpose(2, 3), v.transpose(2, 3)), "k, v")]:
        with pytest.raises(RuntimeError, match=message):
            decode(*args, None, 0.125)
    with pytest.raises(RuntimeError, match="bias"):
        decode(q, k, v, torch.zeros(2, 1, 3, 9), 0.125)


@pytest.mark.parametrize("width", [1, 3])
def test_the_fast_path_uses_it_for_decode_steps_only(decode, monkeypatch, width):
    """fast.attention hands a packed decode step (L = 1) to the kernel and a longer block to SDPA; both give what
    SDPA's grouped-query attention gives."""
    torch.manual_seed(1)
    q = torch.randn(3, width, 6, 64)  # [R, L, Hq, D] on 2 KV heads
    k, v = (torch.randn(3, 2, 20 + width, 64) for _ in range(2))
    calls = []

    def spy(*args):
        calls.append(args[0].shape)
        return decode(*args)

    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, enable_gqa=True, scale=0.125)
    got = attention(q, k, v, Attend(None, packed=True), 0.125, spy)
    assert calls == ([torch.Size([3, 2, 3, 64])] if width == 1 else [])
    assert _relative(got, expected.transpose(1, 2).reshape(3, width, 6 * 64)) < 2e-6


def test_turned_off_or_unbuildable_leaves_sdpa_with_a_reason(monkeypatch, tmp_path):
    from conftest import tiny_target

    monkeypatch.setattr(kernels, "_reason", None)
    kernels.decode_attention.cache_clear()
    try:
        monkeypatch.setenv(kernels.ENV, "0")
        assert kernels.decode_attention(tmp_path / "cache") is None
        assert kernels.unavailable_reason() == f"turned off by {kernels.ENV}=0"
        assert tiny_target("llama").attention_kernel == "sdpa"
        kernels.decode_attention.cache_clear()
        monkeypatch.delenv(kernels.ENV)
        monkeypatch.setattr(kernels, "SOURCE", tmp_path / "broken.cpp")
        monkeypatch.setattr(kernels, "NAME", "dspark_cpu_attention_broken")  # torch versions builds by name
        (tmp_path / "broken.cpp").write_text("this is not C++\n")
        assert kernels.decode_attention(tmp_path / "cache") is None
        assert kernels.unavailable_reason().startswith("could not be built")
    finally:
        kernels.decode_attention.cache_clear()


def test_the_build_folder_names_the_cpu(monkeypatch, tmp_path):
    """A cache shared by machines of different CPUs (-march=native) keeps one build per CPU."""
    here = kernels.build_dir(tmp_path)
    monkeypatch.setattr(kernels, "_cpu", lambda: "another CPU\nflags: sse2")
    assert kernels.build_dir(tmp_path) != here and here.parent == tmp_path / "kernels"


def test_paths_record_which_attention_ran(decode):
    from conftest import tiny_target

    from dspark_bench.target.model import Target

    fast = tiny_target("llama")
    assert fast.attention_kernel == "cpu-decode-kernel"
    assert Target(fast.model, None, "tiny", forward_path="fast-sdpa").attention_kernel == "sdpa"
    assert Target(fast.model, None, "tiny", forward_path="hf").attention_kernel == "hf"


def test_applies_names_what_the_kernel_takes(decode):
    """kernels.applies (asked before a build) and the kernel's own checks agree on head sizes and dtypes."""
    for dim, dtype in ((16, torch.float32), (128, torch.bfloat16), (40, torch.float32), (144, torch.float32)):
        q, k, v, _ = _case(1, 3, 5, dim, dtype, 0)
        if kernels.applies("cpu", dtype, dim):
            decode(q, k, v, None, 0.125)
        else:
            with pytest.raises(RuntimeError, match="multiple of 16 <= 128"):
                decode(q, k, v, None, 0.125)
    assert [kernels.applies("cpu", torch.float32, d) for d in (16, 40, 128, 144)] == [True, False, True, False]
    assert not kernels.applies("cpu", torch.float16, 64) and not kernels.applies("meta", torch.float32, 64)

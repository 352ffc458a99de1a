"""The attention kernels torch offers on the CPU, at the shapes of SmolLM2-135M (9 query heads, 3 KV heads, head
size 64), alternatives to what the fast path runs (``dspark_bench/target/fast.py``):

* prefill, one prompt of n tokens, causal: SDPA with grouped-query heads (the fast path), SDPA over K/V repeated
  to 9 heads, and ``flex_attention`` compiled by torch (its CPU template) with a causal block mask;
* decode and verify blocks, R rows of L queries over 200 cache columns with a bias (holes): SDPA over the packed
  query heads (the fast path) and the same as two matrix products around a float32 softmax, with K/V as the cache
  holds them (views of a buffer with 40 spare columns, ``fast.LayerKV``) and, for the products, also contiguous;
  and our own kernel (``dspark_bench/target/cpu_attention.cpp``), which the fast path runs for decode steps (L = 1).

    python attention_kernels.py     (2 threads; milliseconds per call, medians of 5 x 100 calls)
"""
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from dspark_bench.target import kernels

HQ, HKV, D = 9, 3, 64


def timed(f, calls: int = 100, repeats: int = 5) -> float:
    for _ in range(5):
        f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def prefill_row(flex, n: int) -> str:
    q = torch.randn(1, HQ, n, D, dtype=torch.bfloat16)
    k, v = (torch.randn(1, HKV, n, D, dtype=torch.bfloat16) for _ in range(2))
    kr, vr = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, n, n, device="cpu")
    sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    repeated = timed(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True))
    compiled = timed(lambda: flex(q, k, v, block_mask=mask, enable_gqa=True), calls=20)
    flop = HQ * n * n * D * 2  # both products over the causal half
    return (f"prefill n={n:4d} bf16: SDPA {sdpa:.3f} ms ({flop / sdpa / 1e6:.0f} GFLOP/s), K/V repeated "
            f"{repeated:.3f}, flex_attention {compiled:.3f}")


def decode_row(dtype: torch.dtype, rows: int, width: int, columns: int = 200) -> str:
    g, scale = HQ // HKV, D**-0.5
    q = torch.randn(rows, HKV, g * width, D, dtype=dtype)
    k, v = (torch.randn(rows, HKV, columns + 40, D, dtype=dtype)[:, :, :columns] for _ in range(2))
    kc, vc = k.contiguous(), v.contiguous()
    bias = torch.zeros(rows, 1, g * width, columns, dtype=dtype)
    bias[..., -5:] = torch.finfo(dtype).min  # five holes per row

    def products(k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale).add_(bias)
        return torch.matmul(torch.softmax(scores, -1).to(dtype), v)

    sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale))
    ours = timed(lambda: kernels.decode_attention()(q, k, v, bias, scale))
    flop = rows * HQ * width * columns * D * 4
    return (f"decode {str(dtype)[6:]:8s} R={rows:2d} L={width}: SDPA {sdpa:.3f} ms ({flop / sdpa / 1e6:.0f} GFLOP/s), "
            f"products {timed(lambda: products(k, v)):.3f}, products over contiguous K/V "
            f"{timed(lambda: products(kc, vc)):.3f}, our kernel {ours:.3f} ({sdpa / ours:.2f}x SDPA's speed)")


if __name__ == "__main__":
    torch.manual_seed(0)
    print("threads", torch.get_num_threads())
    with torch.inference_mode():
        flex = torch.compile(flex_attention, dynamic=False)
        for n in (64, 126, 233, 1000):
            print(prefill_row(flex, n))
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 8, 16, 32):
                for width in (1, 8):
                    print(decode_row(dtype, rows, width))

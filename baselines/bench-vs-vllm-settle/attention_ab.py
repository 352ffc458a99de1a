"""Prefill attention: SDPA (what the fast path runs, ``FastForward.apart``) against two batched products and a
float32 softmax per prompt with the query heads of a KV head packed (transformers' eager attention computes the same);
whole prefills of the bench's 16 prompts in groups of GROUP, alternated in one process.

    python attention_ab.py DTYPE GROUP REPEATS   (bf16 8 3 for the README)
"""
import statistics
import sys
import time

import torch

from dspark_bench.engines.native.runner import build_requests
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target import fast
from dspark_bench.target.model import Target

SDPA = fast.FastForward.apart
_BIAS = {}


def products_apart(self, kv, q, k, v, spans):
    """``FastForward.apart`` with each prompt's attention as QK^T + causal bias, softmax in float32, then PV."""
    width = max(n for _, n in spans)
    keys = k.new_zeros(len(spans), self.kv_heads, width, self.head_dim)
    values = torch.zeros_like(keys)
    for r, (start, n) in enumerate(spans):
        keys[r, :, :n] = k[start : start + n].transpose(0, 1)
        values[r, :, :n] = v[start : start + n].transpose(0, 1)
    keys, values = kv.append(keys, values)
    hkv, d = self.kv_heads, self.head_dim
    g = self.heads // hkv
    outs = []
    for r, (start, n) in enumerate(spans):
        if (n, q.dtype) not in _BIAS:
            _BIAS[n, q.dtype] = fast.causal_bias(n, 0, q.dtype, q.device)[0, 0].repeat(g, 1).expand(hkv, g * n, n)
        packed = q[0, start : start + n].view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
        scores = torch.baddbmm(_BIAS[n, q.dtype], packed, keys[r, :, :n].transpose(1, 2), alpha=self.scale)
        weights = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
        out = torch.bmm(weights, values[r, :, :n]).view(hkv, g, n, d).permute(2, 0, 1, 3)
        outs.append(out.reshape(1, n, hkv * g * d))
    return torch.cat(outs, 1)


def main():
    dtype, size, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    target = Target.load("smollm2-135m", dtype=dtype)
    requests = build_requests(target, load_suite("all", 4), 5)
    groups = [[list(r.prompt_ids) for r in requests[i : i + size]] for i in range(0, len(requests), size)]
    arms = {"sdpa": SDPA, "products": products_apart}

    def once(group):
        start = time.perf_counter()
        with torch.inference_mode():
            target.prefill(group)
        return time.perf_counter() - start

    with torch.inference_mode():
        for name, apart in arms.items():
            fast.FastForward.apart = apart
            print(name, "first logits of the first prompt", target.prefill(groups[0])[1].logits[0, -1, :4].tolist())
    times = {name: [] for name in arms}
    for rep in range(repeats):
        for name in list(arms) if rep % 2 == 0 else list(arms)[::-1]:
            fast.FastForward.apart = arms[name]
            times[name] += [once(g) for g in groups]
    fast.FastForward.apart = SDPA
    for name, xs in times.items():
        print(name, f"median {statistics.median(xs) * 1e3:.1f} ms", [round(x * 1e3) for x in xs])
    ratio = statistics.median(b / a for a, b in zip(times["sdpa"], times["products"], strict=True))
    print(f"products / sdpa per prefill: median {ratio:.3f}")


if __name__ == "__main__":
    main()

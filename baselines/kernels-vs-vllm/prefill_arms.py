"""Whole prefills of the bench's 16 prompts in groups of 8, alternated in one process, bf16: the fast path as it is
(``base``) against two changes to it.

* ``compiled``: each layer's elementwise work fused by ``torch.compile`` (inductor's C++ kernels, shapes dynamic):
  the input norm, RoPE over the query and key heads, the residual add with the MLP's norm, and SiLU times up (what
  vLLM's ``fused_add_rms_norm``, ``rotary_embedding`` and ``silu_and_mul`` do in one kernel each);
* ``padded``: the prompts' attention in one SDPA call over [8, heads, longest, D] (each prompt padded at its end,
  causal), instead of one call per prompt.

    python prefill_arms.py REPEATS     (3 for the README)
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from dspark_bench.engines.native.runner import build_requests
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target import fast
from dspark_bench.target.model import Target

BLOCK, APART = fast.FastForward.block, fast.FastForward.apart


def _norm(x, w, eps: float):
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _add_norm(x, y, w, eps: float):
    x = x + y
    return x, _norm(x, w, eps)


def _silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


FUSED = {f.__name__: torch.compile(f, dynamic=True, fullgraph=True) for f in (_norm, _add_norm, _silu_mul, fast.rope)}


def compiled_block(self, w, kv, x, cos, sin, attend, spans=None):
    """``FastForward.block`` for a prefill (``spans``) with the elementwise steps compiled (Llama, no q/k norm)."""
    if spans is None:
        return BLOCK(self, w, kv, x, cos, sin, attend, spans)
    r, n, _ = x.shape
    hq, hkv, d = self.heads, self.kv_heads, self.head_dim
    qkv = w.qkv(FUSED["_norm"](x, w.attn_norm, self.eps)).view(r, n, hq + 2 * hkv, d)
    qk = FUSED["rope"](qkv[:, :, : hq + hkv], cos, sin)
    mixed = self.apart(kv, qk[:, :, :hq], qk[0, :, hq:], qkv[0, :, hq + hkv :], spans)
    x, h = FUSED["_add_norm"](x, w.o(mixed), w.mlp_norm, self.eps)
    return x + w.down(FUSED["_silu_mul"](w.gate_up(h)))


def padded_apart(self, kv, q, k, v, spans):
    """``FastForward.apart`` with one SDPA call over the prompts padded to the longest."""
    rows, width = len(spans), max(n for _, n in spans)
    keys = k.new_zeros(rows, self.kv_heads, width, self.head_dim)
    values = torch.zeros_like(keys)
    queries = q.new_zeros(rows, width, self.heads, self.head_dim)
    for r, (start, n) in enumerate(spans):
        keys[r, :, :n] = k[start : start + n].transpose(0, 1)
        values[r, :, :n] = v[start : start + n].transpose(0, 1)
        queries[r, :n] = q[0, start : start + n]
    keys, values = kv.append(keys, values)
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values, is_causal=True, scale=self.scale,
                                         enable_gqa=True).transpose(1, 2)  # [R, W, Hq, D]
    return torch.cat([out[r, :n] for r, (_, n) in enumerate(spans)]).reshape(1, -1, self.heads * self.head_dim)


ARMS = {"base": (BLOCK, APART), "compiled": (compiled_block, APART), "padded": (BLOCK, padded_apart)}


def main():
    repeats = int(sys.argv[1])
    target = Target.load("smollm2-135m", dtype="bf16")
    requests = build_requests(target, load_suite("all", 4), 5)
    groups = [[list(r.prompt_ids) for r in requests[i : i + 8]] for i in range(0, 16, 8)]
    print("prompt lengths", [[len(p) for p in g] for g in groups])

    def once(group):
        start = time.perf_counter()
        with torch.inference_mode():
            target.prefill(group)
        return time.perf_counter() - start

    first = None
    for name, (block, apart) in ARMS.items():
        fast.FastForward.block, fast.FastForward.apart = block, apart
        start = time.perf_counter()
        with torch.inference_mode():
            logits = target.prefill(groups[0])[1].logits.float()
        first = logits if first is None else first
        print(f"{name}: first call {time.perf_counter() - start:.1f} s, last-position logits at most "
              f"{(logits - first).abs().max().item():.3f} from base's, argmax equal {bool((logits.argmax(-1) == first.argmax(-1)).all())}")
        once(groups[1])
    times = {name: [] for name in ARMS}
    for rep in range(repeats):
        for name in list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]:
            fast.FastForward.block, fast.FastForward.apart = ARMS[name]
            times[name] += [once(g) for g in groups]
    fast.FastForward.block, fast.FastForward.apart = BLOCK, APART
    for name, xs in times.items():
        ratio = statistics.median(b / a for a, b in zip(times["base"], xs, strict=True))
        print(f"{name}: median {statistics.median(xs) * 1e3:.0f} ms {[round(x * 1e3) for x in xs]}, "
              f"over base's time {ratio:.3f}")


if __name__ == "__main__":
    main()

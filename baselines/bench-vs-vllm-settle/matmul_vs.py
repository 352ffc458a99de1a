"""One layer's four products of SmolLM2-135M (QKV fused, O, gate-up fused, down) in bf16 at 1 to 1,000 rows:
torch's F.linear, torch's oneDNN packed product (what our fast path reads up to 512 rows) and vLLM's CPU
``onednn_mm`` with its handle made once (what vLLM 0.32 runs for unquantised linears on this CPU). Run in .venv-vllm.

    python matmul_vs.py
"""
import time

import torch
import torch.nn.functional as F
from vllm import _custom_ops as ops


def timed(f, n=20):
    for _ in range(3):
        f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e3


def main():
    torch.manual_seed(0)
    print("threads", torch.get_num_threads())
    with torch.inference_mode():
        for rows in (1, 8, 130, 1000):
            total = {"F.linear": 0.0, "torch packed": 0.0, "vLLM onednn_mm": 0.0}
            for out_f, in_f in ((960, 576), (576, 576), (3072, 576), (576, 1536)):
                w, x = torch.randn(out_f, in_f, dtype=torch.bfloat16), torch.randn(rows, in_f, dtype=torch.bfloat16)
                packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
                handle = ops.create_onednn_mm(w.t(), 32)
                total["F.linear"] += timed(lambda x=x, w=w: F.linear(x, w))
                total["torch packed"] += timed(
                    lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""))
                total["vLLM onednn_mm"] += timed(lambda x=x, h=handle: ops.onednn_mm(h, x, None))
            print(f"rows {rows}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in total.items()))


if __name__ == "__main__":
    main()

"""The MLP and the two residual adds of one SmolLM2-135M layer, as the fast path runs them (packed products, then
SiLU, the product with up and the adds as kernels of their own) against the same work with oneDNN's post-ops fused
into the products (the gate's product with a SiLU post-op, up's with a multiply by it, O's and down's with an add
of the residual): what vLLM's fused ``silu_and_mul`` and residual adds would save us, if done by oneDNN.

    python epilogues.py     (milliseconds per layer, medians of 5 x 50 calls, 2 threads)
"""
import torch
import torch.nn.functional as F
from attention_kernels import timed  # this folder's timing loop

LINEAR = torch.ops.mkldnn._linear_pointwise
HIDDEN, INTERMEDIATE = 576, 1536


def pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None)


def row(dtype: torch.dtype, rows: int) -> str:
    gate_up = (torch.randn(2 * INTERMEDIATE, HIDDEN) * 0.05).to(dtype)
    down, o = ((torch.randn(*shape) * 0.05).to(dtype) for shape in ((HIDDEN, INTERMEDIATE), (HIDDEN, HIDDEN)))
    p_gate_up, p_down, p_o = pack(gate_up), pack(down), pack(o)
    p_gate, p_up = pack(gate_up[:INTERMEDIATE]), pack(gate_up[INTERMEDIATE:])
    x, attn = torch.randn(rows, HIDDEN).to(dtype), torch.randn(rows, HIDDEN).to(dtype)

    def separate():
        y = x + LINEAR(attn, p_o, None, "none", [], "")
        gate, up = LINEAR(y, p_gate_up, None, "none", [], "").chunk(2, -1)
        return y + LINEAR(F.silu(gate) * up, p_down, None, "none", [], "")

    def fused():
        y = LINEAR.binary(attn, x, p_o, None, "add")
        h = LINEAR.binary(y, LINEAR(y, p_gate, None, "swish", [], ""), p_up, None, "mul")
        return LINEAR.binary(h, y, p_down, None, "add")

    a, b = separate().float(), fused().float()
    error = ((a - b).abs().max() / a.abs().max()).item()
    t_sep, t_fused = timed(separate, calls=50), timed(fused, calls=50)
    return (f"{str(dtype)[6:]:8s} rows {rows:4d}: separate {t_sep:.3f} ms, fused {t_fused:.3f} ms "
            f"({t_fused / t_sep:.3f}x), largest difference {error:.1e} of the largest output")


if __name__ == "__main__":
    torch.manual_seed(0)
    print("threads", torch.get_num_threads())
    with torch.inference_mode():
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 8, 32, 256, 1000):
                print(row(dtype, rows))

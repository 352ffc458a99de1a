"""Where each engine's time goes, by kernel: our engine and vLLM (in this process, so that torch's profiler sees its
kernels) over the same work, bf16: a prefill of 8 prompts (about 1,000 tokens) and decode steps of 16 requests.
vLLM's decode is its 129-token call less its 1-token call over the same 16 prompts, per step; ours is 128 rounds of
a session already past its admission. Ours runs first: vLLM, once loaded, binds the process's OpenMP threads. Self CPU milliseconds per kernel, per prefill / per decode step. Run in .venv-vllm:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 python profile_vs.py
"""
import collections
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

GROUPS = {"matmul": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "_C::onednn_mm"),
          "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "_C::cpu_attention_with_kv_cache",
                        "_C::cpu_attn_reshape_and_cache"),
          "norm, activation, RoPE": ("aten::mul", "aten::silu", "aten::add", "aten::pow", "aten::flip", "aten::sum",
                                     "aten::mean", "aten::rsqrt", "aten::add_", "aten::div_", "aten::cat",
                                     "_C::rms_norm", "_C::fused_add_rms_norm", "_C::silu_and_mul",
                                     "_C::rotary_embedding")}
STEPS = 128  # decode steps: vLLM's are a (1 + STEPS)-token call less a 1-token call, so its prefill cancels
LEAVES = {name for names in GROUPS.values() for name in names}


def self_ms(run, calls: int = 1) -> dict[str, float]:
    """Self CPU milliseconds by kernel name over ``run()``, per ``calls``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    out = collections.Counter()
    for event in prof.key_averages():
        out[event.key] += event.self_cpu_time_total / 1e3 / calls
    return out


def grouped(times: dict[str, float]) -> dict[str, float]:
    out = {group: sum(times.get(k, 0.0) for k in names) for group, names in GROUPS.items()}
    out["everything else (ops)"] = sum(v for k, v in times.items() if k not in LEAVES and k.startswith(("aten::", "_C::", "mkldnn::")))
    return out


def main():
    from dspark_bench import drafters
    from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.target.model import Target

    target = Target.load("smollm2-135m", dtype="bf16")
    requests = build_requests(target, load_suite("all", 4), 5)
    prompts = [list(r.prompt_ids) for r in requests]
    group = prompts[:8]

    def ours_prefill():
        with torch.inference_mode():
            _, out = target.prefill(group)
            torch.softmax(out.logits[:, -1].float(), -1)

    target.eos_ids = frozenset()  # every request decodes all its steps, as vLLM's with ignore_eos
    engine = RoundLoop(target, drafters.create("none", target), EngineConfig(2 + STEPS, 1.0, 7, 16))
    session = engine.session(list(requests), lambda r: None)

    def ours_decode():
        for _ in range(STEPS):
            session.step()

    # ours first: vLLM, once loaded in this process, binds and sizes the OpenMP threads its own way
    print("threads, ours:", torch.get_num_threads())
    for _ in range(2):  # warm-up
        ours_prefill()
    session.step()  # admission and a first round
    ours = {"prefill": grouped(self_ms(ours_prefill)), "decode": grouped(self_ms(ours_decode, STEPS))}

    from vllm import LLM, SamplingParams

    model = str(Path.home() / ".cache/dspark-bench/smollm2-135m-instruct")
    llm = LLM(model=model, dtype="bfloat16", max_model_len=2048, enforce_eager=True, enable_prefix_caching=False,
              max_num_seqs=16, seed=0)
    print("threads, vLLM:", torch.get_num_threads())

    def vllm_call(batch, tokens):
        llm.generate([{"prompt_token_ids": p} for p in batch],
                     [SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True)] * len(batch),
                     use_tqdm=False)

    for _ in range(2):  # warm-up
        vllm_call(group, 1)
    one, many = self_ms(lambda: vllm_call(prompts, 1)), self_ms(lambda: vllm_call(prompts, 1 + STEPS))
    step = {k: (many.get(k, 0.0) - one.get(k, 0.0)) / STEPS for k in set(one) | set(many)}
    print("vLLM's ten costliest kernels in its decode step:",
          ", ".join(f"{k} {v:.2f}" for k, v in sorted(step.items(), key=lambda kv: -kv[1])[:10]))
    theirs = {"prefill": grouped(self_ms(lambda: vllm_call(group, 1))), "decode": grouped(step)}
    for work, title in (("prefill", "prefill of 8 prompts"), ("decode", "decode step of 16 requests")):
        print(f"\n{title}: self CPU ms (vLLM | ours)")
        for name in theirs[work]:
            print(f"  {name:24s} {theirs[work][name]:8.2f} | {ours[work][name]:8.2f}")
        print(f"  {'all ops':24s} {sum(theirs[work].values()):8.2f} | {sum(ours[work].values()):8.2f}")


if __name__ == "__main__":
    main()

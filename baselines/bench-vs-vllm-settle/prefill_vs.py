"""Prefill only, the same 8 prompts (two groups of the bench's 16, about 1,000 tokens each): vLLM's
``generate(max_tokens=1)`` against our ``Target.prefill`` plus the first token's law, alternated in one process,
bf16, each timed call after ``settle`` (the run's other processes idle). Also a torch profile of our prefill.

    python prefill_vs.py REPEATS
"""
import statistics
import sys
import time
from pathlib import Path

import torch


def main():
    from vllm import SamplingParams

    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.engines.vllm.llm import VllmSettings, open_llm
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.bench_vllm import settle
    from dspark_bench.target.model import Target

    reps = int(sys.argv[1])
    target = Target.load("smollm2-135m", dtype="bf16")
    reqs = build_requests(target, load_suite("all", 4), 5)
    groups = [[list(r.prompt_ids) for r in reqs[i:i + 8]] for i in range(0, 16, 8)]
    model = str(Path.home() / ".cache/dspark-bench/smollm2-135m-instruct")
    settings = VllmSettings(model=model, dtype="bf16", seed=0, max_model_len=2048, speculative=None,
                            llm_options={"enable_prefix_caching": False, "max_num_seqs": 8, "enforce_eager": True},
                            threads=torch.get_num_threads())
    engine = open_llm(settings, "none")

    def vllm(group):
        t = time.perf_counter()
        engine.llm.generate([{"prompt_token_ids": p} for p in group], [SamplingParams(max_tokens=1)] * len(group),
                            use_tqdm=False)
        return time.perf_counter() - t

    def ours(group):
        t = time.perf_counter()
        with torch.inference_mode():
            _, out = target.prefill(group)
            torch.softmax(out.logits[:, -1].float(), -1)
        return time.perf_counter() - t

    for g in groups:  # warm-up
        vllm(g), ours(g)
    times = {"vllm": [], "ours": []}
    for rep in range(reps):
        for g in groups:
            for arm in (("vllm", "ours") if rep % 2 == 0 else ("ours", "vllm")):
                settle()
                times[arm].append((vllm if arm == "vllm" else ours)(g))
    engine.close()
    print("tokens per group", [sum(map(len, g)) for g in groups])
    for arm, xs in times.items():
        print(f"{arm}: median {statistics.median(xs) * 1e3:.0f} ms, {[round(x * 1e3) for x in xs]}")
    print(f"ours / vLLM time: median {statistics.median(o / v for o, v in zip(times['ours'], times['vllm'], strict=True)):.3f}")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for g in groups:
            ours(g)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()

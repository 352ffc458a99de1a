"""What vLLM's processes do after a ``generate`` call: the CPU ticks (1/100 s) of every thread of this process and
its descendants in each half-second after one call; then our 8-prompt prefill timed right after a vLLM call and
after pauses of 0.05-2 s (3 calls each), bf16.

    python worker_spin.py
"""
import time
from pathlib import Path

import torch


def ticks(pids):
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            out[f"{pid}/{task.name} {name}"] = int(fields[11]) + int(fields[12])
    return out


def main():
    from vllm import SamplingParams

    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.engines.vllm.llm import VllmSettings, descendants, open_llm
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.target.model import Target

    target = Target.load("smollm2-135m", dtype="bf16")
    group = [list(r.prompt_ids) for r in build_requests(target, load_suite("all", 4), 5)[:8]]
    model = str(Path.home() / ".cache/dspark-bench/smollm2-135m-instruct")
    settings = VllmSettings(model=model, dtype="bf16", seed=0, max_model_len=2048, speculative=None,
                            llm_options={"enable_prefix_caching": False, "max_num_seqs": 8, "enforce_eager": True},
                            threads=torch.get_num_threads())
    engine = open_llm(settings, "none")

    def vllm():
        engine.llm.generate([{"prompt_token_ids": p} for p in group], [SamplingParams(max_tokens=1)] * len(group),
                            use_tqdm=False)

    def ours():
        start = time.perf_counter()
        with torch.inference_mode():
            target.prefill(group)
        return round((time.perf_counter() - start) * 1e3)

    vllm(), ours()
    time.sleep(3)
    pids = [Path("/proc/self").resolve().name, *map(str, descendants())]
    vllm()
    before = ticks(pids)
    for step in range(6):
        time.sleep(0.5)
        now = ticks(pids)
        busy = {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0) > 0}
        print(f"{0.5 * (step + 1):.1f} s after a call, ticks in the last half-second: {busy}", flush=True)
        before = now
    for pause in (0, 0.05, 0.2, 0.5, 1.0, 2.0):
        got = []
        for _ in range(3):
            vllm()
            time.sleep(pause)
            got.append(ours())
        print(f"our prefill {pause} s after a vLLM call: {got} ms", flush=True)
    engine.close()


if __name__ == "__main__":
    main()

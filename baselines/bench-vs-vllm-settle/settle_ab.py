"""`bench --against vllm` at one concurrency with and without the wait for an idle machine before each timed call
(``settle`` in ``dspark_bench/studies/bench_vllm.py``), alternated on one vLLM engine in one process:
block A of REPEATS repeats without the wait, block B with it, then A and B again (the arms inside a repeat
alternate their order as in the bench).

    python settle_ab.py CONCURRENCY REPEATS OUT.json   (bf16 on a CPU with AVX-512-BF16, 16 prompts x 64 tokens)
"""
import json
import sys

import torch

from dspark_bench.cli.bench import _vllm_settings
from dspark_bench.engines.native.runner import build_requests
from dspark_bench.engines.vllm.llm import open_llm
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.studies import bench_vllm
from dspark_bench.studies.bench import BenchSpec
from dspark_bench.target.model import Target


def main():
    conc, repeats, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    spec = BenchSpec(suite="all", limit=4, max_new_tokens=64, temperature=1.0, seed=5, repeats=repeats,
                     concurrency=(conc,), drafters=("none",), hf=False, hf_batch=0)
    target = Target.load("smollm2-135m", dtype="bf16")
    requests = build_requests(target, load_suite("all", 4), 5)
    settings = _vllm_settings(spec, target, "smollm2-135m", "bf16", requests, {})
    engine = open_llm(settings[conc], "none")
    waits = {"none": lambda: None, "settle": bench_vllm.settle}
    blocks = []
    try:
        for arm in ("none", "settle", "none", "settle"):
            result = bench_vllm.level(target, requests, spec, engine, conc, waits[arm])
            blocks.append({"wait": arm, "ratio": result["ratio"], "ours": result["ours"], "vllm": result["vllm"],
                           "repeats": result["repeats"]})
            r = result["ratio"]
            print(f"c={conc} wait={arm}: ours / vLLM " + ", ".join(
                f"{k} {r[k]['median']:.3f} {[round(x, 3) for x in r[k]['per_repeat']]}" for k in bench_vllm.NUMBERS),
                flush=True)
    finally:
        engine.close()
    json.dump({"concurrency": conc, "threads": torch.get_num_threads(), "blocks": blocks}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()

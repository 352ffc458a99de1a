"""The round's laws written into memory reused round after round, against fresh tensors every round, alternated in
one process on one set of weights (arm order rotates every repeat):

* before: ``to_probs`` made a float32 copy of the logits (in bf16) and a fresh [R, k+1, V] softmax output each
  round, and each drafter a fresh zeroed [G, R, V] buffer for its draft laws; the allocator maps such tensors anew
  and the kernel faults them in page by page;
* p: the loop hands ``to_probs`` a view of one buffer (``Scratch``), where the copy and the softmax run in place;
* now: p, and the drafters' draft laws in the buffer the engine lends (``DraftContext.scratch``).

The laws are the same bits in every arm.

    python compare.py LIMIT REPEATS DTYPE   (LIMIT 4: 16 prompts x 32 tokens at T = 1)
Prints, per drafter and concurrency, system tokens/s of each arm over before's per repeat and the median, the
overhead share of each arm, and the minor page faults of each arm's decoding.
"""
import resource
import statistics
import sys
from dataclasses import replace

import torch

from dspark_bench import drafters as registry
from dspark_bench.core import verify
from dspark_bench.core.records import record_from_result
from dspark_bench.drafters import vocab
from dspark_bench.engines.native import loop
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.engines.native.runner import build_requests
from dspark_bench.evaluation.metrics import system_tokens_per_s, time_shares
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target.model import Target

limit, repeats, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
target = Target.load("smollm2-135m", dtype=dtype)
requests = build_requests(target, load_suite("all", limit), 5)
drafters = {n: registry.create(n, target) for n in ("none", "ngram", "dspark")}
config = EngineConfig(32, 1.0, 7, 1)
LEVELS = [(name, c) for c in (1, 8, 32) for name in drafters]
LAW_BUFFER = vocab.DraftHead.law_buffer


def fresh_q(self, *shape, device=None, scratch=None):
    return LAW_BUFFER(self, *shape, device=device)


def fresh_p(logits, sampling, out=None):
    return verify.to_probs(logits, sampling)


ARMS = {"before": (fresh_p, fresh_q), "p": (verify.to_probs, fresh_q), "now": (verify.to_probs, LAW_BUFFER)}


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def once(name, concurrency):
    got = []
    start = faults()
    RoundLoop(target, drafters[name], replace(config, concurrency=concurrency)).run(requests, got.append)
    records = [record_from_result(r, name, "fixed", r.request.request_id, 0, concurrency) for r in got]
    assert all(r.ok for r in records)
    return {"sys": system_tokens_per_s(records), "faults": faults() - start, **time_shares(records)}


for name in drafters:  # warm-up, untimed
    once(name, 1)
print(f"{target.name} {dtype}, {len(requests)} prompts x 32 tokens, {repeats} repeats, torch threads "
      f"{torch.get_num_threads()}", flush=True)
results = {}
order = list(ARMS)
for rep in range(repeats):
    for name, c in LEVELS:
        for arm in order[rep % 3:] + order[: rep % 3]:
            loop.to_probs, vocab.DraftHead.law_buffer = ARMS[arm]
            results.setdefault((name, c, arm), []).append(once(name, c))
        loop.to_probs, vocab.DraftHead.law_buffer = ARMS["now"]
for name, c in LEVELS:
    got = {arm: results[(name, c, arm)] for arm in ARMS}
    parts = []
    for arm in ("p", "now"):
        ratios = [b["sys"] / a["sys"] for a, b in zip(got["before"], got[arm], strict=True)]
        parts.append(f"{arm} / before {statistics.median(ratios):.3f} {[round(r, 3) for r in ratios]}")
    print(f"{name} c={c}: system tok/s " + ", ".join(f"{arm} {statistics.median(x['sys'] for x in v):.1f}"
                                                    for arm, v in got.items())
          + "; " + "; ".join(parts) + "; overhead share " + ", ".join(
              f"{arm} {statistics.median(x['overhead_share'] for x in v):.2%}" for arm, v in got.items())
          + "; page faults " + ", ".join(f"{arm} {statistics.median(x['faults'] for x in v):.0f}"
                                         for arm, v in got.items()), flush=True)

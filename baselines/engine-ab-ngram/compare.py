"""ngram's per-request index (now) against the scan back through the whole context at every round (before),
alternated in one process on one set of weights; the arms swap order every repeat. The drafts are the same in both
(tests/drafters/test_ngram.py), so the tokens are.

    python compare.py LIMIT REPEATS DTYPE TOKENS   (LIMIT 4: 16 prompts at T = 1)
Prints, per concurrency, system tokens/s now / before per repeat and the median, and the overhead share of both arms.
"""
import statistics
import sys
from dataclasses import replace

import torch

from dspark_bench import drafters as registry
from dspark_bench.core.records import record_from_result
from dspark_bench.drafters.base import Proposal
from dspark_bench.drafters.ngram import NgramDrafter, lookup
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.engines.native.runner import build_requests
from dspark_bench.evaluation.metrics import system_tokens_per_s, time_shares
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target.model import Target

limit, repeats, dtype, tokens = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
target = Target.load("smollm2-135m", dtype=dtype)
requests = build_requests(target, load_suite("all", limit), 5)
drafter = registry.create("ngram", target)
config = EngineConfig(tokens, 1.0, 7, 1)


def propose_before(self, ctx):  # the scan of every context at every round
    drafts = [lookup(s.tokens, self.config.max_ngram, self.config.min_ngram, ctx.block_size) for s in ctx.slots]
    width = max((len(d) for d in drafts), default=0)
    out = torch.zeros(len(drafts), width, dtype=torch.long)
    for r, d in enumerate(drafts):
        out[r, : len(d)] = torch.tensor(d, dtype=torch.long)
    return Proposal(out, torch.tensor([len(d) for d in drafts], dtype=torch.long))


ARMS = {"now": NgramDrafter.propose, "before": propose_before}


def once(concurrency):
    got = []
    RoundLoop(target, drafter, replace(config, concurrency=concurrency)).run(requests, got.append)
    records = [record_from_result(r, "ngram", "fixed", r.request.request_id, 0, concurrency) for r in got]
    assert all(r.ok for r in records)
    return {"sys": system_tokens_per_s(records), **time_shares(records)}, [r.output_ids for r in got]


once(1)  # warm-up, untimed
print(f"{target.name} {dtype}, {len(requests)} prompts x {tokens} tokens, {repeats} repeats, torch threads "
      f"{torch.get_num_threads()}", flush=True)
for c in (1, 8):
    results = {"now": [], "before": []}
    for rep in range(repeats):
        outputs = {}
        for arm in (("before", "now") if rep % 2 == 0 else ("now", "before")):
            NgramDrafter.propose = ARMS[arm]
            metrics, outputs[arm] = once(c)
            results[arm].append(metrics)
        NgramDrafter.propose = ARMS["now"]
        assert outputs["now"] == outputs["before"], "the two arms' tokens differ"
    ratios = [b["sys"] / a["sys"] for a, b in zip(results["before"], results["now"], strict=True)]
    print(f"ngram c={c}: system tok/s before {statistics.median(x['sys'] for x in results['before']):.1f}, now "
          f"{statistics.median(x['sys'] for x in results['now']):.1f}; now / before median "
          f"{statistics.median(ratios):.3f} {[round(r, 3) for r in ratios]}; overhead share before "
          f"{statistics.median(x['overhead_share'] for x in results['before']):.2%} now "
          f"{statistics.median(x['overhead_share'] for x in results['now']):.2%}", flush=True)

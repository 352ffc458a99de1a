"""Two engine changes of 2026-12-07, each timed against the code it replaced, alternated in one process on one set of
weights (the replaced code is re-created here and patched in for its arm; the arms swap order every repeat).

A. routing: products of 1-3 rows read the packed weights (now) vs F.linear (before: packed from 4 rows);
   none, mtp and dspark at concurrency 1, none at 2.
B. Markov head: DSpark's Markov head keeps its selected rows and the draft head reads its rows packed (now) vs
   the rows selected at every call and F.linear (before); dspark at concurrency 1, 8, 32.

    python compare.py LIMIT REPEATS DTYPE   (16 prompts x 32 tokens at T = 1: LIMIT 4)
Prints system tokens/s now / before per repeat and the median; time shares of the dspark arms.
"""
import statistics
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

from dspark_bench import drafters as registry
from dspark_bench.core.records import record_from_result
from dspark_bench.drafters import vocab
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.engines.native.runner import build_requests
from dspark_bench.evaluation.metrics import system_tokens_per_s, time_shares
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target import fast
from dspark_bench.target.model import Target

limit, repeats, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
target = Target.load("smollm2-135m", dtype=dtype)
requests = build_requests(target, load_suite("all", limit), 5)
drafters = {n: registry.create(n, target) for n in ("none", "mtp", "dspark")}
config = EngineConfig(32, 1.0, 7, 1)


def linear_before(self, x):  # packed from 4 rows only
    rows, recorded = x.numel() // x.shape[-1], x.requires_grad and torch.is_grad_enabled()
    if self.packed is None or recorded or not 4 <= rows <= fast.PACK_MAX_ROWS:
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def row_linear_before(self, x, compact=False):  # the rows selected at every call
    if self.rows is None:
        return torch.nn.Linear.forward(self, x)
    bias = None if self.bias is None else self.bias[self.rows]
    y = F.linear(x, self.weight.index_select(0, self.rows), bias)
    return y if compact else vocab.expand(y, self.rows, self.out_features, 0.0)


def sub_logits_before(self, h):
    logits = F.linear(h.to(self.weight.dtype), self.weight, self.bias)
    if self.softcap:
        logits = torch.tanh(logits / self.softcap) * self.softcap
    return logits.float()


PATCHES = {"A": [(fast.Linear, "__call__", linear_before)],
           "B": [(vocab.RowLinear, "forward", row_linear_before), (vocab.DraftHead, "sub_logits", sub_logits_before)]}
NOW = {key: [(cls, name, getattr(cls, name)) for cls, name, _ in patches] for key, patches in PATCHES.items()}
LEVELS = {"A": [("none", 1), ("mtp", 1), ("dspark", 1), ("none", 2)], "B": [("dspark", 1), ("dspark", 8), ("dspark", 32)]}


def once(name, concurrency):
    got = []
    RoundLoop(target, drafters[name], replace(config, concurrency=concurrency)).run(requests, got.append)
    records = [record_from_result(r, name, "fixed", r.request.request_id, 0, concurrency) for r in got]
    assert all(r.ok for r in records)
    return {"sys": system_tokens_per_s(records), **time_shares(records)}


for name in drafters:  # warm-up, untimed
    once(name, 1)
print(f"{target.name} {dtype}, {len(requests)} prompts x 32 tokens, {repeats} repeats, torch threads "
      f"{torch.get_num_threads()}", flush=True)
for key in ("A", "B"):
    results = {}
    for rep in range(repeats):
        for name, c in LEVELS[key]:
            for arm in (("before", "now") if rep % 2 == 0 else ("now", "before")):
                for cls, attr, fn in (PATCHES if arm == "before" else NOW)[key]:
                    setattr(cls, attr, fn)
                results.setdefault((name, c, arm), []).append(once(name, c))
            for cls, attr, fn in NOW[key]:
                setattr(cls, attr, fn)
    for name, c in LEVELS[key]:
        before, now = results[(name, c, "before")], results[(name, c, "now")]
        ratios = [b["sys"] / a["sys"] for a, b in zip(before, now)]
        line = (f"{key} {name} c={c}: system tok/s before {statistics.median(x['sys'] for x in before):.1f}, now "
                f"{statistics.median(x['sys'] for x in now):.1f}; now / before median {statistics.median(ratios):.3f} "
                f"{[round(r, 3) for r in ratios]}")
        if name == "dspark":
            line += "; " + ", ".join(f"{k} before {statistics.median(x[k] for x in before):.2%} now "
                                     f"{statistics.median(x[k] for x in now):.2%}"
                                     for k in ("overhead_share", "markov_head_share", "sample_share"))
        print(line, flush=True)

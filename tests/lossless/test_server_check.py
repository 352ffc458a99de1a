"""``check-lossless --engine openai``'s check on a tiny target: a fake server that samples the target's own law (and
reports vLLM-style per-step counts placed by ngram's rule) passes; one whose drafting steps sample another law, or
that reuses one seed, fails; a speculative one without per-request statistics is inconclusive. Plus the pure parts:
the server's speculation from ``--server-spec`` and ``/metrics``, the goodness-of-fit cells."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_EOS, random_prompts

from dspark_bench.engines.http.completions import Completion
from dspark_bench.lossless.server import (
    ServerPlan,
    check_server,
    gof_cells,
    parse_server_spec,
    speculation,
)
from dspark_bench.lossless.verified import proposer_rule
from dspark_bench.lossless.vllm import VllmPlan

pytestmark = pytest.mark.usefixtures("one_thread")
PLAN = VllmPlan(prompts=4, tokens=16, seeds_per_prompt=24, block=3, detect=0.3, max_waves=12)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
VLLM_METRICS = "vllm:num_requests_running{engine=\"0\"} 0.0\n"
SPEC_METRICS = VLLM_METRICS + "vllm:spec_decode_num_drafts_total{engine=\"0\"} 4.0\n"


class LawServer:
    """Samples the target's law token by token (seeded per request). With ``spec``, each step its drafting rule
    picks commits 1..k+1 tokens and is reported as vLLM's per-step counts (``stats``: "detailed", "summary" or
    None); ``drafted_temperature`` samples those steps' tokens at another temperature (a broken verifier);
    ``one_seed`` ignores the request's seed."""

    def __init__(self, target, spec=None, stats="detailed", drafted_temperature=1.0, one_seed=False):
        self.target, self.spec, self.stats = target, spec, stats
        self.temperature, self.one_seed = drafted_temperature, one_seed
        self.rule = proposer_rule(spec) if spec else None

    def law(self, context, temperature=1.0):
        with torch.inference_mode():
            logits = self.target.model(input_ids=torch.tensor([context])).logits[0, -1].double()
        return torch.softmax(logits / temperature, -1)

    def one(self, prompt, seed, max_tokens):
        g = torch.Generator().manual_seed(0 if self.one_seed else seed)
        out, logprobs, steps = [], [], []
        k = int((self.spec or {}).get("num_speculative_tokens", 0))
        while len(out) < max_tokens and (not out or out[-1] != TINY_EOS):
            drafting = bool(out) and self.rule is not None and self.rule([*prompt, *out])
            n = 1 + (int(torch.randint(0, k + 1, (1,), generator=g)) if drafting else 0)
            if drafting:
                steps.append(n - 1)
            for _ in range(n):
                law = self.law([*prompt, *out])
                sampled = law if not drafting or self.temperature == 1.0 else self.law([*prompt, *out],
                                                                                          self.temperature)
                y = int(torch.multinomial(sampled, 1, generator=g))
                out.append(y)
                logprobs.append(math.log(float(law[y])))
                if y == TINY_EOS:
                    break
        return Completion(tuple(out[:max_tokens]), tuple(logprobs[:max_tokens]), "length", self._stats(steps, k))

    def _stats(self, accepted, k):
        if not self.spec or self.stats is None:
            return None
        metrics = {"num_spec_steps": len(accepted), "num_accepted_draft_tokens": sum(accepted),
                   "num_draft_tokens": k * len(accepted)}
        if self.stats == "detailed":
            metrics.update(per_step_drafted=[k] * len(accepted), per_step_accepted=accepted)
        return {"metrics": {"speculative_decoding": metrics}}

    def many(self, prompts, seeds, max_tokens):
        return [self.one(p, s, max_tokens) for p, s in zip(prompts, seeds, strict=True)]


@pytest.fixture(scope="module")
def prompts():
    return [tuple(p) for p in random_prompts(PLAN.prompts, seed=3, min_len=6, max_len=10)]


def _check(tiny, prompts, server, spec):
    return check_server(ServerPlan(PLAN, 0, "fake"), server, tiny, prompts, spec, lambda _m: None)


def _verdicts(rows):
    return {r.test: r.verdict for r in rows}


def test_a_server_without_speculation_that_samples_the_law_passes(tiny, prompts):
    rows, evidence = _check(tiny, prompts, LawServer(tiny), None)
    assert _verdicts(rows) == {"pit-ks": "pass", "chi2-gof": "pass"}, rows
    assert all("with power .99" in r.detail for r in rows)
    assert evidence["server_law"]["mean_abs"] < 1e-6  # the same law, the same logprobs
    assert evidence["verification"]["verified_tokens"] == 0 and evidence["verification"]["verified_share"] == 0


def test_a_lossless_ngram_server_passes_with_its_verified_tokens_placed(tiny, prompts):
    rows, evidence = _check(tiny, prompts, LawServer(tiny, NGRAM), NGRAM)
    assert _verdicts(rows) == {"pit-ks": "pass", "pit-ks verified": "pass", "chi2-gof": "pass"}, rows
    share = evidence["verification"]
    assert share["unaligned_requests"] == 0 and share["verified_tokens"] >= rows[0].power_n
    assert 0.3 < share["verified_share"] < 1 and evidence["verification"]["positions"]["rounds"] > 0


def test_a_server_whose_drafting_steps_sample_another_law_fails(tiny, prompts):
    rows, _ = _check(tiny, prompts, LawServer(tiny, NGRAM, drafted_temperature=2.5), NGRAM)
    assert _verdicts(rows)["pit-ks verified"] == "fail", rows


def test_a_server_that_reuses_one_seed_fails_the_goodness_of_fit(tiny, prompts):
    rows, _ = _check(tiny, prompts, LawServer(tiny, one_seed=True), None)
    assert _verdicts(rows)["chi2-gof"] == "fail", rows


def test_without_per_step_counts_the_verified_row_is_not_judged_and_the_count_still_states_the_power(tiny, prompts):
    rows, evidence = _check(tiny, prompts, LawServer(tiny, NGRAM, stats="summary"), NGRAM)
    verified = next(r for r in rows if r.test == "pit-ks verified")
    assert verified.verdict == "n/a" and "--per-request-spec-decode-metrics detailed" in verified.detail
    assert evidence["verification"]["verified_tokens"] > 0
    assert _verdicts(rows)["pit-ks"] in ("pass", "inconclusive")


def test_a_speculative_server_without_statistics_is_inconclusive_never_ok(tiny, prompts):
    rows, _ = _check(tiny, prompts, LawServer(tiny, NGRAM, stats=None), NGRAM)
    pit = next(r for r in rows if r.test == "pit-ks")
    assert pit.verdict == "inconclusive" and "unknown" in pit.detail


def test_a_speculative_server_of_unknown_method_has_its_verified_row_unjudged(tiny, prompts):
    spec = speculation(None, SPEC_METRICS)
    assert spec == {}  # /metrics says it speculates, not how
    rows, evidence = _check(tiny, prompts, LawServer(tiny, NGRAM), spec)
    verified = next(r for r in rows if r.test == "pit-ks verified")
    assert verified.verdict == "n/a" and "--server-spec" in verified.detail
    assert evidence["verification"]["verified_tokens"] > 0


# ---- pure parts ---------------------------------------------------------------------------------------------
def test_server_spec_parsing_applies_vllms_ngram_defaults():
    assert parse_server_spec(None) is None and parse_server_spec("none") is False
    assert parse_server_spec('{"method": "ngram"}')["prompt_lookup_min"] == 5
    got = parse_server_spec('{"method": "ngram", "prompt_lookup_max": 3}')
    assert (got["prompt_lookup_min"], got["prompt_lookup_max"]) == (3, 3)
    with pytest.raises(ValueError, match="--speculative-config"):
        parse_server_spec("[1, 2]")


@pytest.mark.parametrize(("given", "metrics", "expected"), [
    (None, VLLM_METRICS, None), (None, SPEC_METRICS, {}), (False, None, None), (NGRAM, None, NGRAM),
    (NGRAM, SPEC_METRICS, NGRAM),
])
def test_speculation_from_the_option_and_the_servers_metrics(given, metrics, expected):
    assert speculation(given, metrics) == expected


@pytest.mark.parametrize(("given", "metrics", "message"), [
    (False, SPEC_METRICS, "it speculates"), (NGRAM, VLLM_METRICS, "does not speculate"),
    (None, None, "cannot tell"), (None, "llama_tokens 3\n", "cannot tell"),
])
def test_speculation_that_contradicts_or_cannot_be_told_is_refused(given, metrics, message):
    with pytest.raises(ValueError, match=message):
        speculation(given, metrics)


def test_the_goodness_of_fit_cells_partition_the_two_token_law():
    law1 = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    second = torch.tensor([0.7, 0.2, 0.05, 0.05], dtype=torch.float64)
    cell, probs = gof_cells(law1, {0: second, 2: second}, frozenset({2}))
    assert math.isclose(sum(probs), 1.0) and min(probs) >= 0
    assert probs[cell((0, 1))] == pytest.approx(0.5 * 0.2)
    assert probs[cell((2,))] == pytest.approx(0.15)  # an EOS first token is its own cell
    assert cell((1, 0)) == cell((3, 3)) == len(probs) - 1  # every other first token

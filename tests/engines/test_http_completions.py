"""Token-id completions (``POST /v1/completions``): parsing vLLM's response (ids, logprobs, per-request speculative
statistics), refusing one without token ids, the request body, and the client against a small local server
(127.0.0.1, a free port) that answers, refuses, stalls, or is down. No request hangs or raises from ``many``."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from local_http import LocalServer

from dspark_bench.engines.http.client import ServerError
from dspark_bench.engines.http.completions import (
    Completions,
    api_key_headers,
    completion_body,
    parse_completion,
)
from dspark_bench.engines.http.spec import drafted_tokens

# A vLLM 0.32 completion with --per-request-spec-decode-metrics detailed (ngram, 3 draft tokens), cut to its fields.
VLLM = {
    "id": "cmpl-1", "object": "text_completion", "model": "smol",
    "choices": [{"index": 0, "text": ", green, blue", "finish_reason": "length",
                 "logprobs": {"text_offset": [0, 1, 7, 8], "token_logprobs": [-0.01, -0.2, -0.05, -3.5],
                              "tokens": ["token_id:28", "token_id:4967", "token_id:28", "token_id:5478"],
                              "top_logprobs": [{"token_id:28": -0.01}, {"token_id:4967": -0.2},
                                               {"token_id:28": -0.05}, {"token_id:5478": -3.5}]}}],
    "usage": {"prompt_tokens": 25, "completion_tokens": 4, "total_tokens": 29},
    "metrics": {"speculative_decoding": {"mean_acceptance_length": 3.0, "draft_acceptance_rate": 0.667,
                                         "acceptance_histogram": [0, 0, 1, 0], "num_spec_steps": 1,
                                         "num_accepted_draft_tokens": 2, "num_draft_tokens": 3, "num_spec_tokens": 3,
                                         "per_step_accepted": [2], "per_step_drafted": [3]}},
}


def test_a_vllm_completion_gives_ids_logprobs_and_step_counts():
    out = parse_completion(VLLM)
    assert out.ok and out.output_ids == (28, 4967, 28, 5478) and out.finish == "length"
    assert out.logprobs == (-0.01, -0.2, -0.05, -3.5)
    assert drafted_tokens(out.stats, 4) == 3  # one step: 2 accepted + 1


def test_the_summary_level_still_counts_the_drafted_tokens():
    spec = dict(VLLM["metrics"]["speculative_decoding"])
    del spec["per_step_accepted"], spec["per_step_drafted"]
    out = parse_completion({**VLLM, "metrics": {"speculative_decoding": spec}})
    assert drafted_tokens(out.stats, 4) == 3 and drafted_tokens(None, 4) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"logprobs": None}, "no logprobs.tokens"),
    ({"logprobs": {"tokens": [",", " green"], "token_logprobs": [-0.1, -0.2]}}, "ignores return_tokens_as_token_ids"),
])
def test_a_completion_without_token_ids_is_refused(change, message):
    body = {**VLLM, "choices": [{**VLLM["choices"][0], **change}], "usage": None}
    with pytest.raises(ServerError, match=message):
        parse_completion(body)


def test_ids_that_disagree_with_the_usage_count_are_refused():
    with pytest.raises(ServerError, match="counts 5 completion tokens"):
        parse_completion({**VLLM, "usage": {"completion_tokens": 5}})


def test_the_body_asks_for_exact_sampling_and_ids():
    body = completion_body("smol", (1, 2, 3), 7, 16)
    assert body["prompt"] == [1, 2, 3] and body["seed"] == 7 and body["temperature"] == 1.0
    assert (body["top_p"], body["top_k"], body["min_p"], body["repetition_penalty"]) == (1.0, 0, 0.0, 1.0)
    assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True and body["stream"] is False


def test_the_api_key_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("SMOL_KEY", "k-123")
    assert api_key_headers("SMOL_KEY") == {"Authorization": "Bearer k-123"} and api_key_headers(None) == {}
    monkeypatch.delenv("SMOL_KEY")
    with pytest.raises(ServerError, match="SMOL_KEY"):
        api_key_headers("SMOL_KEY")


class Server(LocalServer):
    """Answers seed 0 with VLLM, refuses seed 1 (HTTP 400), stalls seed 2 past the client's timeout."""

    def routes(self):
        return [web.post("/v1/completions", self.complete)]

    async def complete(self, request):
        body = await request.json()
        if body["seed"] == 1:
            return web.json_response({"error": {"message": "prompt too long"}}, status=400)
        if body["seed"] == 2:
            await asyncio.sleep(3)
        return web.json_response(VLLM)

    def __enter__(self):
        return f"http://127.0.0.1:{super().__enter__().port}/v1"


def test_every_request_comes_back_answered_refused_or_timed_out():
    with Server() as url:
        outs = Completions(url, "smol", {}, timeout_s=0.5).many([(1, 2)] * 3, [0, 1, 2], 4)
    assert outs[0].ok and outs[0].output_ids == (28, 4967, 28, 5478)
    assert "HTTP 400" in outs[1].error and "prompt too long" in outs[1].error
    assert "timed out" in outs[2].error


def test_a_server_that_is_down_is_an_error_not_a_hang():
    (out,) = Completions("http://127.0.0.1:9/v1", "smol", {}, timeout_s=2).many([(1,)], [0], 4)
    assert not out.ok and out.error

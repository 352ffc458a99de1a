"""A llama.cpp server as an engine and as a lossless check's sampler, against a fake that answers as llama.cpp's
``llama-server`` (build b1-0c1e570, from llama-cpp-python 0.3.36's sources) answered on 2026-12-07, responses
trimmed: ``/v1/models`` entries ``owned_by: llamacpp``, no ``/version`` but ``/props`` with ``build_info``; chat
chunks whose ``logprobs.content`` entries carry an integer ``id``, none for the tokens of a speculative step, no
delta for the end-of-sequence token; ``timings`` with ``draft_n`` only where a request drafted; the native
``/completion`` with ``return_tokens``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner
from local_http import LocalServer

from dspark_bench.cli.main import main
from dspark_bench.engines.http.client import (
    LLAMA_CPP_OFF,
    ServerError,
    Streamed,
    dialect_of,
    id_fields,
    read_events,
    token_ids_of,
)
from dspark_bench.engines.http.completions import Completions, parse_native
from dspark_bench.engines.http.engine import complete_ids
from dspark_bench.engines.http.spec import totals_from_stats
from dspark_bench.evaluation.runs import read_manifest, read_records

# (text, id or None): the ids a real stream gave, None where a speculative step's token came without one
STREAM = [("def", 1604), (" sum", 2028), ("_", 79), ("multiple", None), ("(", None), ("x", 104)]


def _entry(token_id: int, text: str) -> dict:
    return {"id": token_id, "token": text, "bytes": list(text.encode()), "logprob": -0.5,
            "top_logprobs": [{"id": token_id, "token": text, "bytes": list(text.encode()), "logprob": -0.5}]}


class LlamaCppServer(LocalServer):
    def __init__(self, ids_for_all: bool = False, drafted: bool = True):
        super().__init__()
        self.ids_for_all, self.drafted, self.bodies = ids_for_all, drafted, []

    def routes(self):
        return [web.get("/v1/models", self.models), web.get("/props", self.props),
                web.post("/v1/chat/completions", self.chat), web.post("/completion", self.native)]

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": "smol-f32.gguf", "object": "model", "owned_by": "llamacpp",
             "meta": {"n_vocab": 49152, "n_ctx": 2048, "ftype": "all F32"}}]})

    async def props(self, request):
        return web.json_response({"build_info": "b1-0c1e570", "total_slots": 4})

    def timings(self, n: int) -> dict:
        out = {"cache_n": 0, "prompt_n": 9, "prompt_ms": 120.0, "predicted_n": n, "predicted_ms": 190.0}
        return {**out, "draft_n": 8, "draft_n_accepted": 2} if self.drafted else out

    async def chat(self, request):
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
                "object": "chat.completion.chunk"}
        await resp.write(f"data: {json.dumps(head)}\n\n".encode())
        for text, token in STREAM:
            choice = {"finish_reason": None, "index": 0, "delta": {"content": text}}
            if token is not None or self.ids_for_all:
                choice["logprobs"] = {"content": [_entry(token if token is not None else 5, text)]}
            await asyncio.sleep(0.002)
            await resp.write(f"data: {json.dumps({'choices': [choice], 'object': 'chat.completion.chunk'})}\n\n"
                             .encode())
        # a stop: the end-of-sequence token is counted in usage and never streamed
        final = {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], "object": "chat.completion.chunk"}
        usage = {"choices": [], "object": "chat.completion.chunk", "timings": self.timings(len(STREAM) + 1),
                 "usage": {"completion_tokens": len(STREAM) + 1, "prompt_tokens": 9, "total_tokens": 16}}
        for event in (final, usage):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def native(self, request):
        body = await request.json()
        self.bodies.append(body)
        tokens = [10279, 253, 18904, 617][: body["n_predict"]]
        return web.json_response({"content": "x", "tokens": tokens, "stop": True, "tokens_predicted": len(tokens),
                                  "tokens_evaluated": len(body["prompt"]), "stop_type": "limit",
                                  "timings": self.timings(len(tokens))})


def _run(server, out, *extra):
    return CliRunner().invoke(main, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.port}/v1",
                                     "--suite", "math", "--limit", "2", "--max-new-tokens", "7", "--out", str(out),
                                     *extra])


def test_the_dialect_is_read_from_the_models_list():
    assert dialect_of([{"id": "m", "owned_by": "llamacpp"}]) == "llama.cpp"
    assert dialect_of([{"id": "m", "owned_by": "vllm"}]) == dialect_of([]) == "openai"
    assert id_fields("llama.cpp", chat=True) == {"logprobs": True, "top_logprobs": 1}
    assert id_fields("llama.cpp", chat=False) == {"logprobs": 1}  # llama.cpp reads 0 as "no probabilities"
    with pytest.raises(ValueError, match="unknown server dialect"):
        id_fields("sglang-native", chat=True)


def test_ids_come_from_either_form_and_a_token_without_one_is_refused():
    chunk = {"choices": [{"logprobs": {"content": [_entry(33, "1"), {"token": "token_id:7"}]}}]}
    assert token_ids_of(chunk) == [33, 7]
    with pytest.raises(ServerError, match="no id"):
        token_ids_of({"choices": [{"logprobs": {"content": [{"token": "1", "logprob": -1.0}]}}]})


def test_a_run_drops_ids_with_gaps_and_counts_tokens_from_usage(tmp_path):
    with LlamaCppServer() as server:
        done = _run(server, tmp_path / "run")
        sent = [b for b in server.bodies if b["max_tokens"] == 7]
    assert done.exit_code == 0, done.output
    assert sent and all(b["top_logprobs"] == 1 and "return_tokens_as_token_ids" not in b for b in sent)
    assert all(b[k] == v for b in sent for k, v in LLAMA_CPP_OFF.items())  # its own samplers sent switched off
    records = read_records(tmp_path / "run")
    assert len(records) == 4 and all(r.output_ids == () and r.n_output == 7 for r in records)  # 2 per math set
    assert {r.spec_totals for r in records} == {("llama.cpp-timings", 7, 2, 8)}
    engine = read_manifest(tmp_path / "run")["engine"]
    assert engine["dialect"] == "llama.cpp" and engine["version"] == "llama.cpp b1-0c1e570"
    assert engine["token_ids"] == {"complete": 0, "dropped": 4, "none": 0} and "dropped" in engine["token_ids_note"]
    serving = json.loads((tmp_path / "run" / "summary.json").read_text())["serving"]["server"]
    assert serving["output_tokens"] == 28  # from usage, not from the (dropped) ids


def test_ids_short_only_of_the_end_of_sequence_token_are_kept(tmp_path):
    with LlamaCppServer(ids_for_all=True, drafted=False) as server:
        done = _run(server, tmp_path / "run")
    assert done.exit_code == 0, done.output
    records = read_records(tmp_path / "run")
    assert all(r.output_ids == (1604, 2028, 79, 5, 5, 104) and r.output_tokens is None for r in records)
    # no draft_n: llama.cpp drafted nothing for these requests, which counts as such, not as unknown
    assert {r.spec_totals for r in records} == {("llama.cpp-timings", 6, 0, 0)}
    assert read_manifest(tmp_path / "run")["engine"]["token_ids"]["complete"] == 4


def test_a_check_samples_through_the_native_endpoint():
    with LlamaCppServer() as server:
        client = Completions(f"http://127.0.0.1:{server.port}/v1", "smol-f32.gguf", {}, timeout_s=5,
                             dialect="llama.cpp")
        out = client.one((1, 504, 3458), seed=4, max_tokens=3)
        (body,) = server.bodies
    assert out.output_ids == (10279, 253, 18904) and out.finish == "length" and out.logprobs == (None,) * 3
    assert out.stats == {"timings": {"cache_n": 0, "prompt_n": 9, "prompt_ms": 120.0, "predicted_n": 3,
                                     "predicted_ms": 190.0, "draft_n": 8, "draft_n_accepted": 2}}
    assert body["prompt"] == [1, 504, 3458] and body["return_tokens"] is True and body["cache_prompt"] is False
    assert body["n_predict"] == 3 and body["seed"] == 4 and body["top_k"] == 0 and body["repeat_penalty"] == 1.0


@pytest.mark.parametrize("response, ok", [
    ({"tokens": [1, 2], "tokens_predicted": 3, "stop_type": "eos"}, True),  # the end-of-sequence token has no id
    ({"tokens": [1, 2], "tokens_predicted": 3, "stop_type": "limit"}, False),
    ({"content": "x", "tokens_predicted": 2, "stop_type": "limit"}, False),  # no return_tokens: an old build
])
def test_native_responses_are_taken_only_whole(response, ok):
    if ok:
        assert parse_native(response).output_ids == (1, 2) and parse_native(response).finish == "stop"
    else:
        with pytest.raises(ServerError):
            parse_native(response)


def test_a_recorded_llamacpp_stream_lacks_the_ids_of_speculative_tokens():
    """A stream recorded from the real llama-server (ngram-simple, 8 draft tokens, f32 weights, seed 7,
    ``top_logprobs: 1``), 2026-12-07: 64 tokens by usage, 50 ids. The 14 text deltas without logprobs come from
    its speculative steps, whose tokens the server sends without probabilities (its source: "TODO: set
    result.probs"); this request drafted 50 tokens and accepted 11."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
    reading = read_events((folder / "llamacpp-b1-0c1e570-ngram-stream.txt").read_text().splitlines())
    assert reading.done and reading.finish == "length" and reading.usage["completion_tokens"] == 64
    assert len(reading.ids) == 50 and len(reading.deliveries) == 64  # one delivery per token, 14 without an id
    out = Streamed(0, "ok", None, reading.finish, "".join(reading.text), tuple(reading.ids), 0.0,
                   tuple(reading.deliveries), 64, 25, reading.stats)
    assert complete_ids(out) is None  # dropped: the ids that came would sit at the wrong positions
    source, n, accepted, drafted = totals_from_stats(reading.stats, 64)
    assert (source, n, accepted, drafted) == ("llama.cpp-timings", 64, 11, 50)


def test_the_check_opens_a_llamacpp_server_in_its_dialect():
    from dspark_bench.lossless.server import ServerOptions, open_server

    with LlamaCppServer() as server:
        client, facts, _ = open_server(ServerOptions(f"http://127.0.0.1:{server.port}/v1"))
    assert client.dialect == "llama.cpp" and client.model == "smol-f32.gguf"
    assert facts["dialect"] == "llama.cpp" and facts["version"] == "llama.cpp b1-0c1e570"
    assert "weights of type all F32 (/v1/models meta.ftype)" in facts["law"]


def test_the_law_fact_names_what_the_server_says_of_its_weights():
    from dspark_bench.lossless.server import law_fact

    assert "weights of type Q4_0" in law_fact([{"id": "m", "meta": {"ftype": "Q4_0"}}], "m")
    assert "not reported" in law_fact([{"id": "m", "meta": {"ftype": "Q4_0"}}], "other")
    assert "not reported" in law_fact([{"id": "m", "root": "m"}], "m")  # vLLM's entry

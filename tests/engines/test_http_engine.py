"""``run --engine openai`` end to end against a small local OpenAI-compatible server (127.0.0.1, a free port, in a
thread, stopped at the end): records, manifest, summary with serving metrics, rounds from per-request statistics,
counters diffed around the run, and a server that fails a request."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from click.testing import CliRunner
from local_http import LocalServer

from dspark_bench.cli.main import main
from dspark_bench.evaluation.runs import read_manifest, read_records

STEPS = {"drafted": [3, 3], "accepted": [2, 0]}  # two verify steps: 3 + 1 tokens, then the rest one by one


class FakeServer(LocalServer):
    """Streams 6 tokens per request in three deliveries; counts drafts in /metrics; fails prompts containing
    'FAIL' with HTTP 500."""

    def __init__(self):
        super().__init__()
        self.drafts = 0
        self.stats = {"metrics": {"speculative_decoding": {"per_step_drafted": STEPS["drafted"],
                                                           "per_step_accepted": STEPS["accepted"]}}}
        self.bodies = []

    def routes(self):
        return [web.get("/v1/models", self.models), web.get("/version", self.version),
                web.get("/metrics", self.metrics), web.post("/v1/chat/completions", self.chat)]

    async def models(self, request):
        return web.json_response({"data": [{"id": "smol", "object": "model", "max_model_len": 2048}]})

    async def version(self, request):
        return web.json_response({"version": "0.0-fake"})

    async def metrics(self, request):
        return web.Response(text=f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}.0\n'
                                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {3 * self.drafts}.0\n'
                                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.drafts}.0\n')

    async def chat(self, request):
        body = await request.json()
        self.bodies.append(body)
        if "FAIL" in body["messages"][0]["content"] or body["max_tokens"] == 0:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ids in ([7], [8, 9, 10], [11, 12]):
            await asyncio.sleep(0.005)
            chunk = {"choices": [{"index": 0, "delta": {"content": "x" * len(ids)}, "finish_reason": None,
                                  "logprobs": {"content": [{"token": f"token_id:{i}"} for i in ids]}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.drafts += 2
        last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
                 **self.stats}
        for event in (last, usage):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp



@pytest.fixture
def server():
    with FakeServer() as s:
        yield s


def test_open_loop_run_against_a_server(server, tmp_path):
    out = tmp_path / "run"
    done = CliRunner().invoke(main, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.port}/v1",
                                     "--suite", "math", "--limit", "2", "--max-new-tokens", "6", "--seed", "5",
                                     "--request-rate", "20", "--slo", "ttft=5000,tpot=5000", "--out", str(out)])
    assert done.exit_code == 0, done.output
    records = read_records(out)
    assert len(records) == 4 and {r.drafter for r in records} == {"server"}
    rec = records[0]
    assert rec.output_ids == (7, 8, 9, 10, 11, 12) and rec.prompt_len == 9 and rec.status == "ok"
    assert rec.rounds == ((3, 3, 2, 3), (3, 3, 0, 1), (0, 0, 0, 1))  # 1 (prefill) + 3 + 1 + 1 = 6 tokens
    assert len(rec.itl_s) == 2 and rec.e2el_s >= rec.queue_s + rec.ttft_s
    assert sorted(r.arrival_s for r in records)[0] == 0.0 and len({r.arrival_s for r in records}) == 4
    sent = [b for b in server.bodies if b["max_tokens"] == 6]
    assert {b["seed"] for b in sent} == {r.seed for r in records} and all(b["logprobs"] for b in sent)
    manifest = read_manifest(out)
    assert manifest["engine"]["metric_source"] == "vllm-per-request"
    assert manifest["engine"]["counter_delta"]["num_drafts"] == 8 and manifest["engine"]["version"] == "0.0-fake"
    assert manifest["engine"]["arrivals"] == {"rate": 20.0, "burstiness": 1.0, "seed": 5, "process": "poisson"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["serving"]["server"]["completed"] == 4 and summary["serving"]["server"]["good_requests"] == 4
    assert summary["server_counters"]["acceptance_length"] == pytest.approx(2.0)  # 8 accepted over 8 drafts


def test_a_server_that_gives_totals_not_steps(server, tmp_path):
    """llama.cpp's ``timings``: each request's totals are kept in its record and summed per label; no rounds are
    invented from them."""
    server.stats = {"timings": {"predicted_n": 6, "draft_n": 6, "draft_n_accepted": 3}}
    out = tmp_path / "run"
    done = CliRunner().invoke(main, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.port}/v1",
                                     "--suite", "math", "--limit", "2", "--max-new-tokens", "6", "--out", str(out)])
    assert done.exit_code == 0, done.output
    records = read_records(out)
    assert {r.spec_totals for r in records} == {("llama.cpp-timings", 6, 3, 6)} and all(not r.rounds for r in records)
    assert read_manifest(out)["engine"]["metric_source"] == "llama.cpp-timings"
    totals = json.loads((out / "summary.json").read_text())["server_totals"]["server"]
    # per request: 5 tokens after the first, 3 of them accepted drafts -> 2 steps; 4 requests
    assert totals == {"source": "llama.cpp-timings", "requests": 4, "accepted": 12, "drafted": 24, "steps": 8,
                      "tau": 2.5, "acceptance_rate": 0.5}


def test_failed_requests_are_recorded_and_fail_the_run(server, tmp_path):
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"turns": ["fine"]}\n{"turns": ["FAIL please"]}\n')
    out = tmp_path / "run"
    done = CliRunner().invoke(main, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.port}/v1",
                                     "--suite", str(suite), "--limit", "all", "--max-new-tokens", "6",
                                     "--concurrency", "2", "--out", str(out)])
    assert done.exit_code == 1
    records = {r.status: r for r in read_records(out)}
    assert set(records) == {"ok", "error"} and "HTTP 500" in records["error"].error


@pytest.mark.parametrize("args, says", [(["--model", "nope"], "serves smol"), (["--repeats", "2"], "--repeats"),
                                        (["--drafter", "a,b"], "one label"), (["--scheduler", "threshold"], "drop --scheduler"),
                                        (["--api-key-env", "DSPARK_TEST_UNSET_KEY"], "is not set")])
def test_what_a_server_run_cannot_do_is_refused_before_anything_is_written(server, tmp_path, args, says):
    out = tmp_path / "run"
    done = CliRunner().invoke(main, ["run", "--engine", "openai", "--base-url", f"http://127.0.0.1:{server.port}/v1",
                                     "--limit", "1", "--out", str(out), *args])
    assert done.exit_code == 2 and says in done.output and not out.exists(), done.output

"""``sweep --server``: a request-rate sweep of two OpenAI-compatible servers (small local fakes on 127.0.0.1, free
ports, stopped at the end): one ``sweep.json`` with a row per server and rate and the serving comparison against
the baseline server, the report's serving section from it, finished cells kept on a rerun, an unfinished cell set
aside and run again whole, and what a server sweep cannot take refused before anything is sent."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from click.testing import CliRunner
from local_http import LocalServer

from dspark_bench.cli.main import main
from dspark_bench.evaluation.runs import read_manifest, read_records


class PacedServer(LocalServer):
    """Streams 6 tokens per request in 3 deliveries, ``gap_s`` apart: the faster server gives the shorter TPOT."""

    def __init__(self, gap_s: float):
        super().__init__()
        self.gap_s, self.requests = gap_s, 0

    def routes(self):
        return [web.get("/v1/models", self.models), web.post("/v1/chat/completions", self.chat)]

    async def models(self, request):
        return web.json_response({"data": [{"id": "smol", "object": "model"}]})

    async def chat(self, request):
        await request.json()
        self.requests += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ids in ([7], [8, 9], [10, 11, 12]):
            await asyncio.sleep(self.gap_s)
            chunk = {"choices": [{"index": 0, "delta": {"content": "x" * len(ids)}, "finish_reason": None,
                                  "logprobs": {"content": [{"token": f"token_id:{i}"} for i in ids]}}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}}
        for event in ({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, usage):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
def servers():
    with PacedServer(0.06) as slow, PacedServer(0.01) as fast:
        yield slow, fast


def _sweep(slow, fast, out, *extra):
    return CliRunner().invoke(main, ["sweep", "--server", f"none=http://127.0.0.1:{slow.port}/v1",
                                     "--server", f"fast=http://127.0.0.1:{fast.port}/v1", "--request-rate", "4,40",
                                     "--slo", "tpot=200", "--suite", "math", "--limit", "2", "--max-new-tokens", "6",
                                     "--seed", "3", "--out", str(out), *extra])


def test_a_rate_sweep_of_two_servers_compares_them_and_reports(servers, tmp_path):
    slow, fast = servers
    out = tmp_path / "sweep"
    done = _sweep(slow, fast, out)
    assert done.exit_code == 0, done.output
    result = json.loads((out / "sweep.json").read_text())
    cells = [(r["drafter"], r["request_rate"]) for r in result["rows"]]
    assert cells == [("none", 4.0), ("fast", 4.0), ("fast", 40.0), ("none", 40.0)]  # order reversed at every other rate
    assert all(r["n_requests"] == 4 and r["n_errors"] == 0 and r["label"] == "server" for r in result["rows"])
    assert result["spec"]["servers"] == {"none": f"http://127.0.0.1:{slow.port}/v1",
                                         "fast": f"http://127.0.0.1:{fast.port}/v1"}
    # each server saw one warm-up and 4 requests per rate, with the same seeds at both rates
    assert (slow.requests, fast.requests) == (10, 10)
    for row in result["rows"]:
        records = read_records(out / row["folder"] / "run")
        assert sorted(r.seed for r in records) == [3, 3, 4, 4]
        assert read_manifest(out / row["folder"] / "run")["engine"]["arrivals"]["rate"] == row["request_rate"]
    serving = result["serving"]
    assert serving["baseline"] == "none server" and serving["tpot_slo_ms"] == 200
    (method,) = serving["methods"]
    assert method["method"] == "fast server"
    by = {(r["drafter"], r["request_rate"]): r for r in result["rows"]}
    assert by["fast", 4.0]["p90_tpot_ms"] < by["none", 4.0]["p90_tpot_ms"]  # 10 ms against 60 ms between deliveries
    assert method["ratio_min"] is None or method["ratio_min"] > 1
    report = CliRunner().invoke(main, ["report", str(out), "-o", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report" / "report.md").read_text()
    assert "fast server" in text and "none server" in text


def test_a_rerun_keeps_finished_cells_and_runs_an_unfinished_one_again_whole(servers, tmp_path):
    slow, fast = servers
    out = tmp_path / "sweep"
    assert _sweep(slow, fast, out).exit_code == 0
    first = json.loads((out / "sweep.json").read_text())
    cut = out / "cells" / "fast__server__r40" / "run"
    (cut / "summary.json").unlink()  # as if the sweep stopped inside this cell
    before = (slow.requests, fast.requests)
    done = _sweep(slow, fast, out)
    assert done.exit_code == 0, done.output
    assert (slow.requests, fast.requests) == (before[0], before[1] + 5)  # that cell alone, warm-up and 4 requests
    assert (cut.parent / "run.partial-1" / "records.jsonl").exists() and (cut / "summary.json").exists()
    again = json.loads((out / "sweep.json").read_text())
    kept = [r for r in again["rows"] if r["folder"] != "cells/fast__server__r40"]
    assert kept == [r for r in first["rows"] if r["folder"] != "cells/fast__server__r40"]


@pytest.mark.parametrize(("args", "says"), [
    (["--drafter", "dspark"], "--drafter: our engine's settings"),
    (["--profile", "p.json", "--repeats", "2"], "--profile, --repeats: our engine's settings"),
    (["--baseline", "ngram"], "--baseline 'ngram' is not a --server label"),
])
def test_what_a_server_sweep_cannot_take_is_refused_before_a_request(servers, tmp_path, args, says):
    slow, fast = servers
    done = _sweep(slow, fast, tmp_path / "sweep", *args)
    assert done.exit_code == 2 and says in done.output, done.output
    assert (slow.requests, fast.requests) == (0, 0) and not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--server", "none=http://127.0.0.1:9/v1"], "give --request-rate"),
    (["--server", "none:http://x", "--request-rate", "1"], "give LABEL=URL"),
    (["--server", "a=http://h/v1", "--server", "a=http://g/v1", "--request-rate", "1"], "its own label and URL"),
    (["--model", "smol", "--request-rate", "1"], "--model is for a server sweep"),
])
def test_bad_server_options_are_refused(args, says, tmp_path):
    done = CliRunner().invoke(main, ["sweep", *args, "--out", str(tmp_path / "sweep")])
    assert done.exit_code == 2 and says in done.output, done.output

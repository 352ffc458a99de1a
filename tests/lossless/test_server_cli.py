"""``check-lossless --engine openai`` through the CLI against a small local server (127.0.0.1, a free port, in a
thread) that samples a tiny target's own law, saved as a model folder: ok, with lossless.json holding the server's
facts and evidence; and each refusal (no token ids, server down, options of another engine) one line, exit 2,
before the target loads."""

from __future__ import annotations

import json
import math

import pytest
import torch
from aiohttp import web
from click.testing import CliRunner
from conftest import TINY_EOS, tiny_target
from local_http import LocalServer

from dspark_bench.cli.main import main
from dspark_bench.target.model import Target

pytestmark = pytest.mark.usefixtures("one_thread")
METRICS = 'vllm:num_requests_running{engine="0"} 0.0\n'  # a vLLM server without speculation


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny target with a word-level tokenizer, saved as a model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny") / "model"
    tiny_target("llama").model.save_pretrained(out)
    words = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(92))])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(out)
    return out


class LawServer(LocalServer):
    """vLLM's endpoints for one model: completions sampled from the tiny target's law (``tokens="text"``: tokens
    as text, as a server that ignores return_tokens_as_token_ids; without a model: two fixed tokens)."""

    def __init__(self, model, tokens="ids"):
        super().__init__()
        self.model, self.tokens = model, tokens

    def routes(self):
        return [web.get("/v1/models", self.models), web.get("/version", self.version),
                web.get("/metrics", self.metrics), web.post("/v1/completions", self.complete)]

    async def models(self, request):
        return web.json_response({"data": [{"id": "tiny", "root": "/m", "max_model_len": 1024}]})

    async def version(self, request):
        return web.json_response({"version": "0.0-fake"})

    async def metrics(self, request):
        return web.Response(text=METRICS)

    async def complete(self, request):
        body = await request.json()
        g, ids, logprobs = torch.Generator().manual_seed(body["seed"]), [], []
        if self.model is None:
            ids, logprobs = [5, 6], [-1.0, -1.0]
        while self.model is not None and len(ids) < body["max_tokens"] and (not ids or ids[-1] != TINY_EOS):
            with torch.inference_mode():
                logits = self.model.model(input_ids=torch.tensor([[*body["prompt"], *ids]])).logits[0, -1]
            law = torch.softmax(logits.double(), -1)
            ids.append(int(torch.multinomial(law, 1, generator=g)))
            logprobs.append(math.log(float(law[ids[-1]])))
        tokens = [f"token_id:{i}" if self.tokens == "ids" else f"w{i}" for i in ids]
        return web.json_response({"choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": {
            "tokens": tokens, "token_logprobs": logprobs}}], "usage": {"completion_tokens": len(ids)}})

    def __enter__(self):
        return f"http://127.0.0.1:{super().__enter__().port}/v1"


def _check(*args):
    return CliRunner().invoke(main, ["check-lossless", *args])


def _one_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    return lines[0]


def test_a_server_that_samples_the_law_passes_and_its_facts_are_kept(folder, tmp_path):
    with LawServer(Target.load(str(folder), dtype="fp32")) as url:
        res = _check("--engine", "openai", "--base-url", url, "--target", str(folder), "--out", str(tmp_path / "c"))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "c" / "lossless.json").read_text())
    assert data["verdict"] == "ok" and {r["test"] for r in data["rows"]} == {"pit-ks", "chi2-gof"}
    engine = data["engine"]
    assert engine["model"] == "tiny" and engine["version"] == "0.0-fake" and engine["speculative_config"] is None
    assert engine["speculation_source"] == "/metrics" and "float32" in engine["law"]
    (evidence,) = data["evidence"].values()
    assert evidence["server_law"]["mean_abs"] < 1e-4 and evidence["verification"]["tokens"] > 0


@pytest.fixture
def no_target(monkeypatch):
    """A refusal must come before the target loads."""

    def refuse(*a, **k):
        raise AssertionError("the target was loaded before the server was checked")

    monkeypatch.setattr(Target, "load", refuse)


def test_a_server_without_token_ids_is_refused_before_the_target_loads(folder, tmp_path, no_target):
    with LawServer(None, tokens="text") as url:
        res = _check("--engine", "openai", "--base-url", url, "--target", str(folder), "--out", str(tmp_path / "c"))
    assert "return_tokens_as_token_ids" in _one_line(res)


@pytest.mark.parametrize(("args", "needle"), [
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1"], "cannot reach an OpenAI-compatible server"),
    (["--engine", "openai"], "needs --base-url"),
    (["--engine", "openai", "--base-url", "localhost:8000"], "http(s)://HOST:PORT/v1"),
    (["--base-url", "http://127.0.0.1:9/v1"], "give it with --engine openai, not --engine dspark"),
    (["--engine", "vllm", "--base-url", "http://127.0.0.1:9/v1"], "give it with --engine openai, not --engine vllm"),
    (["--server-spec", "none"], "--server-spec describe a server"),
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--scheduler", "fixed"], "--scheduler is ours"),
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--engine-opt", "fix=cpu-expand"],
     "--engine-opt configures vLLM's offline engine"),
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--drafter", "ngram"], "--drafter picks"),
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--server-spec", "ngram"], "--speculative-config"),
])
def test_bad_server_options_are_one_line(folder, tmp_path, no_target, args, needle):
    assert needle in _one_line(_check(*args, "--target", str(folder), "--out", str(tmp_path / "c")))

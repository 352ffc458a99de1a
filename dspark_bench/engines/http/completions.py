"""Exact token-id completions from an OpenAI-compatible server (``POST /v1/completions``), for checks that must
know which tokens went in and came out. No model here.

A prompt goes as a list of token ids (vLLM takes ``prompt: [int, ...]``: no chat template, no re-tokenising), and
the emitted tokens come back as ids: ``logprobs: 0`` with vLLM's ``return_tokens_as_token_ids`` makes each entry of
``choices[0].logprobs.tokens`` read ``token_id:N``, beside the sampled token's log-probability under the server's
own logits (``token_logprobs``). A llama.cpp server (dialect ``llama.cpp``) is asked on its native ``POST
/completion`` with ``return_tokens``: its OpenAI endpoints give no id for the tokens of a speculative step, while
``tokens`` there holds every emitted id (no log-probabilities: they would be missing for those tokens as well).
Sampling is T = 1 unless asked otherwise, every filter and penalty sent switched off (a server left to choose
applies its model's generation config), and a per-request ``seed``; the response is not streamed (what a check needs arrives at the end: vLLM's per-request speculative statistics ``metrics`` included).

Every request has a timeout. A server that is down, refuses, or returns text where ids were asked for is a
:class:`~dspark_bench.engines.http.client.ServerError` from :func:`parse_completion` / :meth:`Completions.one`,
or a :class:`Completion` with ``error`` set from :meth:`Completions.many` (one failed request never hides the
others).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dspark_bench.engines.http.client import LLAMA_CPP_OFF, ServerError, id_fields, stats_of, token_id


@dataclass(frozen=True)
class Completion:
    """One request's outcome: emitted ids, the server's log-probability of each (None where it gave none), its
    finish reason and raw per-request statistics (``{"metrics": ...}``), or ``error`` when it failed."""

    output_ids: tuple[int, ...] = ()
    logprobs: tuple[float | None, ...] = ()
    finish: str | None = None
    stats: Mapping[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def completion_body(model: str, prompt: Sequence[int], seed: int, max_tokens: int, temperature: float = 1.0,
                    dialect: str = "openai") -> dict[str, Any]:
    """The request body: token-id prompt, sampling with every filter and penalty off (llama.cpp's own samplers
    too, for a llama.cpp server), ids and logprobs back in the server's ``dialect``."""
    return {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": max_tokens,
            "temperature": temperature, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": seed, "n": 1, "stream": False,
            **(LLAMA_CPP_OFF if dialect == "llama.cpp" else {}), **id_fields(dialect, chat=False)}


def parse_completion(body: Mapping[str, Any]) -> Completion:
    """A ``text_completion`` response as a :class:`Completion`; a ServerError when it holds no token ids. The ids
    come from ``logprobs.tokens`` (vLLM: ``token_id:N``, with ``token_logprobs``) or ``logprobs.content`` (llama.cpp:
    each entry's ``id`` and ``logprob``)."""
    choices = body.get("choices") or []
    if not choices:
        raise ServerError(f"the server's completion has no choices: {json.dumps(body)[:200]}")
    logprobs = choices[0].get("logprobs") or {}
    tokens, content = logprobs.get("tokens"), logprobs.get("content")
    if tokens is None and content is None:
        raise ServerError("the server returned no logprobs.tokens or logprobs.content: without them its emitted token "
                          "ids are unknown (an OpenAI-compatible server that honours logprobs and vLLM's "
                          "return_tokens_as_token_ids, or llama.cpp's server, is needed)")
    if tokens is not None:
        bad = [t for t in tokens if not str(t).startswith("token_id:")]
        if bad:
            raise ServerError(f"the server returned token {bad[0]!r}, not 'token_id:N': it ignores "
                              "return_tokens_as_token_ids (a vLLM option), so its emitted token ids are unknown")
        ids = tuple(int(str(t).removeprefix("token_id:")) for t in tokens)
        values = list(logprobs.get("token_logprobs") or [None] * len(ids))
    else:
        ids = tuple(token_id(item) for item in content)
        values = [item.get("logprob") for item in content]
    completion_tokens = (body.get("usage") or {}).get("completion_tokens")
    if completion_tokens is not None and completion_tokens != len(ids):
        raise ServerError(f"the server counts {completion_tokens} completion tokens but returned {len(ids)} ids")
    return Completion(ids, tuple(None if v is None else float(v) for v in values), choices[0].get("finish_reason"),
                      stats_of(body))


def native_body(prompt: Sequence[int], seed: int, max_tokens: int, temperature: float = 1.0) -> dict[str, Any]:
    """llama.cpp's ``/completion`` body: the same sampling as :func:`completion_body` in its own names, every
    emitted id back, the prompt cache off (each request is computed from its prompt alone)."""
    return {"prompt": [int(t) for t in prompt], "n_predict": max_tokens, "temperature": temperature, "top_p": 1.0,
            "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, **LLAMA_CPP_OFF,
            "seed": seed, "stream": False, "return_tokens": True, "cache_prompt": False}


_STOPS = {"eos": "stop", "word": "stop", "limit": "length"}  # llama.cpp's stop_type as OpenAI's finish_reason


def parse_native(body: Mapping[str, Any]) -> Completion:
    """A llama.cpp ``/completion`` response as a :class:`Completion` (ids from ``tokens``, statistics from
    ``timings``); a ServerError when it holds no ids or fewer than it says it predicted."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise ServerError("the llama.cpp server returned no 'tokens' (it ignores return_tokens: too old a build)")
    predicted = body.get("tokens_predicted")
    stop = body.get("stop_type")
    # the end-of-sequence token counts as predicted but is not among the ids
    if predicted is not None and predicted != len(tokens) and not (stop == "eos" and predicted == len(tokens) + 1):
        raise ServerError(f"the server counts {predicted} predicted tokens but returned {len(tokens)} ids")
    return Completion(tuple(int(t) for t in tokens), (None,) * len(tokens), _STOPS.get(stop, stop),
                      stats_of(body))


def server_root(base_url: str) -> str:
    """``http://host:port`` of ``http://host:port/v1`` (where ``/metrics``, ``/version`` and llama.cpp's native
    endpoints live)."""
    return base_url.rstrip("/").removesuffix("/v1")


def fetch(url: str, headers: Mapping[str, str], timeout_s: float, body: Mapping[str, Any] | None = None) -> str:
    """GET (or POST ``body`` as JSON) ``url``; the response text. HTTP errors raise ServerError with the server's
    words; an unreachable server raises ``OSError``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={**headers, **({"Content-Type": "application/json"}
                                                                          if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (a URL the user gave)
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300].replace("\n", " ")
        raise ServerError(f"HTTP {exc.code} from {url}: {detail}") from None


def api_key_headers(env: str | None) -> dict[str, str]:
    """A bearer token from the environment variable ``env`` names (no header without one); the key is never
    kept anywhere else."""
    if not env:
        return {}
    key = os.environ.get(env)
    if not key:
        raise ServerError(f"--api-key-env {env}: that environment variable is not set (or empty)")
    return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class Completions:
    """Token-id completions of one served ``model`` at ``base_url`` (``http://HOST:PORT/v1``)."""

    base_url: str
    model: str
    headers: Mapping[str, str]
    timeout_s: float = 300.0
    concurrency: int = 8  # requests in flight: the server batches them
    dialect: str = "openai"  # how token ids are asked for (client.dialect_of)

    def one(self, prompt: Sequence[int], seed: int, max_tokens: int) -> Completion:
        """One completion; ServerError (or OSError: unreachable, timed out) when it fails."""
        if self.dialect == "llama.cpp":
            text = fetch(server_root(self.base_url) + "/completion", self.headers, self.timeout_s, native_body(prompt, seed, max_tokens))
        else:
            text = fetch(self.base_url.rstrip("/") + "/completions", self.headers, self.timeout_s,
                         completion_body(self.model, prompt, seed, max_tokens, dialect=self.dialect))
        try:
            return (parse_native if self.dialect == "llama.cpp" else parse_completion)(json.loads(text))
        except json.JSONDecodeError:
            raise ServerError(f"the server's completion is not JSON: {text[:200]!r}") from None

    def many(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_tokens: int) -> list[Completion]:
        """Completions of ``prompts`` (with ``seeds``), in order; a failed request is a Completion with error."""

        def attempt(args) -> Completion:
            try:
                return self.one(*args, max_tokens)
            except (ServerError, OSError) as exc:  # TimeoutError is an OSError
                return Completion(error=f"{type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(attempt, zip(prompts, seeds, strict=True)))

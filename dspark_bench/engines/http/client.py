"""A streaming client for OpenAI-compatible chat completions, timed per delivery. No model here, no run folder.

Terms:

* **delivery**: one server-sent event that carries output (text or token ids). Under speculative decoding one
  delivery may carry several tokens (a verify step's accepted tokens and its bonus), so inter-token latencies are
  gaps between deliveries, as ``vllm bench serve`` measures them.
* **sent** / **first** / **last**: when the request left the client, when its first and its last delivery
  arrived, on the client's monotonic clock in seconds from the run's start.
* **token ids**: where the server returns them, asked for in the server's dialect (:func:`dialect_of`): vLLM and
  servers like it (``openai``): ``logprobs`` with ``return_tokens_as_token_ids``, each token then reads
  ``token_id:N``; ``llama.cpp``: ``logprobs`` with one top log-probability, each token then carries its ``id``.
  None otherwise (the text is kept either way).
* **server statistics**: whatever speculative statistics the response carries per request, kept raw (vLLM with
  ``--per-request-spec-decode-metrics``, SGLang's ``meta_info``, llama.cpp's ``timings``) and read by
  :mod:`dspark_bench.engines.http.spec`.

Every request has a timeout; a refused request, a server that is down and a stream that ends without its
``[DONE]`` each give a response with ``status="error"`` and the reason, never an exception and never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


class ServerError(ValueError):
    """A server that cannot be used as asked (unreachable, no such model, no token ids where they are needed)."""


DIALECTS = ("openai", "llama.cpp")  # how a server is asked for token ids, and how it returns them
# llama.cpp's own samplers beyond the OpenAI ones, each sent switched off (its server's command line can set them on
# for every request): the repetition penalty, DRY, XTC, typical-p, mirostat and top-n-sigma.
LLAMA_CPP_OFF = {"repeat_penalty": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "typical_p": 1.0,
                 "mirostat": 0, "top_n_sigma": -1.0}


def dialect_of(models: Sequence[Mapping[str, Any]]) -> str:
    """``llama.cpp`` when the server's ``/v1/models`` entries say they are llama.cpp's (``owned_by: llamacpp``),
    else ``openai`` (vLLM's ``return_tokens_as_token_ids``, which SGLang takes too)."""
    return "llama.cpp" if any(m.get("owned_by") == "llamacpp" for m in models) else "openai"


def id_fields(dialect: str, chat: bool) -> dict[str, Any]:
    """The body fields that make a server of ``dialect`` return each emitted token's id (chat completions, or
    ``/v1/completions`` when not ``chat``). llama.cpp returns a token's id only beside its probabilities, and reads
    ``logprobs`` of a completion and ``top_logprobs`` of a chat completion as how many to return (0: none, so no
    ids): one is asked for."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown server dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    if dialect == "llama.cpp":
        return {"logprobs": True, "top_logprobs": 1} if chat else {"logprobs": 1}
    return {"logprobs": True, "return_tokens_as_token_ids": True} if chat else {"logprobs": 0,
                                                                                 "return_tokens_as_token_ids": True}


def token_id(item: Mapping[str, Any]) -> int:
    """The id of one ``logprobs.content`` entry: llama.cpp's integer ``id``, or vLLM's ``token_id:N`` token."""
    if isinstance(item.get("id"), int) and not isinstance(item.get("id"), bool):
        return int(item["id"])
    token = str(item.get("token", ""))
    if not token.startswith("token_id:"):
        raise ServerError(f"the server returned token {token!r} with no id: it ignores return_tokens_as_token_ids "
                          f"(a vLLM option) and gives no llama.cpp-style 'id'")
    return int(token.removeprefix("token_id:"))


@dataclass(frozen=True)
class ChatRequest:
    """One request of a run: its position, the user turn, its seed and when it arrives (s from the run's start)."""

    index: int
    text: str
    seed: int
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Sampling:
    """What every request of a run asks for. ``extra``: server-specific body fields (e.g. vLLM's
    ``return_tokens_as_token_ids``), merged into the request body. The filters are always sent, off ones too
    (top_p 1, top_k 0, min_p 0): a server left to choose applies its model's generation config (vLLM's
    ``--generation-config auto``), which may set them. ``top_k`` and ``min_p`` are not OpenAI fields; vLLM,
    SGLang and llama.cpp's servers read them from the body. ``dialect``: how token ids are asked for
    (:func:`id_fields`)."""

    model: str
    max_tokens: int
    temperature: float
    token_ids: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    dialect: str = "openai"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        body = {"model": self.model, "messages": [{"role": "user", "content": request.text}],
                "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "min_p": self.min_p, "seed": request.seed,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.dialect == "llama.cpp":
            body.update(LLAMA_CPP_OFF)
        if self.token_ids:
            body.update(id_fields(self.dialect, chat=True))
        return {**body, **self.extra}


@dataclass(frozen=True)
class Streamed:
    """What came back for one request (times in seconds from the run's start)."""

    index: int
    status: str  # "ok" or "error"
    error: str | None
    finish: str | None  # the server's finish_reason ("stop", "length", ...)
    text: str
    token_ids: tuple[int, ...] | None
    sent_s: float
    deliveries: tuple[tuple[float, int], ...]  # (arrival time, tokens carried) of each delivery with output
    completion_tokens: int | None  # the server's usage counts
    prompt_tokens: int | None
    server_stats: Mapping[str, Any] | None = None  # raw per-request speculative statistics, when present

    @property
    def first_s(self) -> float | None:
        return self.deliveries[0][0] if self.deliveries else None

    @property
    def last_s(self) -> float | None:
        return self.deliveries[-1][0] if self.deliveries else None


def token_ids_of(chunk: Mapping[str, Any]) -> list[int] | None:
    """The token ids a chunk carries (each ``logprobs.content`` entry's, :func:`token_id`), or None without
    logprobs."""
    choices = chunk.get("choices") or []
    content = ((choices[0].get("logprobs") or {}).get("content") if choices else None)
    return None if content is None else [token_id(item) for item in content]


def stats_of(chunk: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Per-request speculative statistics a chunk carries, wherever the known servers put them."""
    for key in ("metrics", "meta_info", "timings"):
        if isinstance(chunk.get(key), Mapping):
            return {key: chunk[key]}
    usage = chunk.get("usage")
    if isinstance(usage, Mapping) and any(k not in ("prompt_tokens", "completion_tokens", "total_tokens",
                                                     "prompt_tokens_details") for k in usage):
        return {"usage": usage}
    return None


@dataclass
class _Reading:
    """The state of one stream being read."""

    text: list[str] = field(default_factory=list)
    ids: list[int] | None = None
    deliveries: list[tuple[float, int]] = field(default_factory=list)
    finish: str | None = None
    usage: Mapping[str, Any] | None = None
    stats: Mapping[str, Any] | None = None
    done: bool = False

    def add(self, chunk: Mapping[str, Any], now: float) -> None:
        """Take one parsed event (a ``chat.completion.chunk``)."""
        if "error" in chunk:
            raise ServerError(f"the server reported an error mid-stream: {chunk['error']}")
        choices = chunk.get("choices") or []
        text = (choices[0].get("delta") or {}).get("content") or "" if choices else ""
        ids = token_ids_of(chunk)
        if ids is not None:
            self.ids = (self.ids or []) + ids
        if text or ids:
            self.text.append(text)
            self.deliveries.append((now, len(ids) if ids is not None else 1))
        if choices and choices[0].get("finish_reason"):
            self.finish = choices[0]["finish_reason"]
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        self.stats = stats_of(chunk) or self.stats


def read_events(lines: Sequence[str], clock: Callable[[], float] = time.monotonic) -> _Reading:
    """Parse a recorded stream (the ``data:`` lines of an SSE body), for tests and replays."""
    reading = _Reading()
    for line in lines:
        _take(reading, line, clock())
    return reading


def _take(reading: _Reading, line: str, now: float) -> None:
    line = line.strip()
    if not line.startswith("data:"):
        return  # comments (": ping"), blank separators, "event:" lines
    data = line.removeprefix("data:").strip()
    if data == DONE:
        reading.done = True
        return
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise ServerError(f"the server sent an event that is not JSON: {data[:120]!r}") from None
    reading.add(chunk, now)


# A request whose connection failed before any answer (aiohttp reused a kept-alive connection the server had just
# closed: llama.cpp's server closes one after a few requests, and the POST then fails with "Can not write request
# body") is sent once more on a new connection; its times start from that second send. A failure after an answer is
# never retried. Seen on 2026-12-07: 3 of 12 requests of a run against llama-server failed this way.


async def stream_one(session, url: str, sampling: Sampling, request: ChatRequest, t0: float, timeout_s: float,
                     headers: Mapping[str, str]) -> Streamed:
    """POST one streamed chat completion and read it to its end (or its timeout); retried once on a connection
    that failed before any answer (the comment above)."""
    import aiohttp

    for attempt in range(2):
        sent = time.monotonic() - t0
        reading, answered = _Reading(), False
        try:
            async with asyncio.timeout(timeout_s):
                async with session.post(url, json=sampling.body(request), headers=dict(headers)) as resp:
                    answered = True
                    if resp.status != 200:
                        detail = (await resp.text())[:300].replace("\n", " ")
                        raise ServerError(f"HTTP {resp.status}: {detail}")
                    async for raw in resp.content:
                        _take(reading, raw.decode("utf-8", "replace"), time.monotonic() - t0)
            if not reading.done:
                raise ServerError("the stream ended without [DONE] (the server dropped it)")
            status, error = "ok", None
        except TimeoutError:
            status, error = "error", f"timed out after {timeout_s:g} s"
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            if not answered and attempt == 0:
                continue  # a stale kept-alive connection (the comment above stream_one)
            status, error = "error", f"{type(exc).__name__}: {exc}"
        except (ServerError, aiohttp.ClientError, OSError) as exc:
            status, error = "error", f"{type(exc).__name__}: {exc}"
        break
    return Streamed(request.index, status, error, reading.finish, "".join(reading.text),
                    tuple(reading.ids) if reading.ids is not None else None, sent, tuple(reading.deliveries),
                    (reading.usage or {}).get("completion_tokens"), (reading.usage or {}).get("prompt_tokens"),
                    reading.stats)


async def stream_all(base_url: str, sampling: Sampling, requests: Sequence[ChatRequest], max_concurrency: int | None,
                     timeout_s: float, headers: Mapping[str, str] | None = None,
                     on_done: Callable[[Streamed], None] = lambda s: None) -> list[Streamed]:
    """Send every request at its arrival time (open loop), at most ``max_concurrency`` in flight (None: no cap);
    ``on_done`` sees each response as it completes. Returns the responses in request order."""
    import aiohttp

    url = base_url.rstrip("/") + "/chat/completions"
    cap = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.monotonic()

        async def one(req: ChatRequest) -> Streamed:
            await asyncio.sleep(max(0.0, req.arrival_s - (time.monotonic() - t0)))
            if cap is None:
                out = await stream_one(session, url, sampling, req, t0, timeout_s, headers or {})
            else:
                async with cap:
                    out = await stream_one(session, url, sampling, req, t0, timeout_s, headers or {})
            on_done(out)
            return out

        return list(await asyncio.gather(*(one(r) for r in requests)))

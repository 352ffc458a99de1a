"""Any OpenAI-compatible server behind the engine interface (``run --engine openai --base-url URL``).

The server's speculative configuration is fixed when it starts, so a run decodes one configuration, named by
``--server-label`` (its "drafter" in the records; default ``server``). Each prompt becomes one streamed chat
completion with the run's seed (base seed + index within its dataset), sampling (temperature, top_p, top_k,
min_p) and max tokens, sent at its arrival time (``--request-rate``; closed loop without one: ``--concurrency``
requests in flight, all arriving at once). A record per request, as each completes: the server's token ids, TTFT from sending, every inter-delivery
gap, end-to-end latency from arrival, time spent waiting for the client's concurrency cap (``queue_s``), and
rounds (or, from SGLang and llama.cpp, totals) from the server's per-request speculative statistics when it
returns them (:mod:`.spec`; ``summary.json``'s ``server_totals`` sums the totals per label). The server's
``vllm:spec_decode_*`` counters are read before and after the run; their differences are in the manifest and
give the run's τ when no per-request rounds came back.

The API key, if any, is read from the environment variable ``--api-key-env`` names and sent as a bearer token;
it is never written to the run folder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dspark_bench.core.records import RequestRecord
from dspark_bench.engines.base import (
    Engine,
    EngineError,
    EngineOptions,
    RunSpec,
    arrival_schedule,
    load_facts,
    register_engine,
)
from dspark_bench.engines.http.client import (
    ChatRequest,
    Sampling,
    ServerError,
    Streamed,
    dialect_of,
    stream_all,
)
from dspark_bench.engines.http.completions import api_key_headers, server_root
from dspark_bench.engines.http.prometheus import spec_counters
from dspark_bench.engines.http.spec import rounds_from_stats, totals_from_stats, totals_summary
from dspark_bench.engines.vllm.llm import counter_delta
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import SCHEMA_VERSION, SUMMARY, RunWriter, environment, write_json
from dspark_bench.evaluation.serving import serving_by_drafter
from dspark_bench.evaluation.suites import Prompt

DEFAULT_LABEL = "server"


def _get(url: str, headers: dict[str, str], timeout_s: float = 10.0) -> str:
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (a URL the user gave)
        return resp.read().decode("utf-8", "replace")


def server_version(base_url: str, headers: dict[str, str]) -> str | None:
    """What the server says its version is: ``/version``'s ``version`` (vLLM, SGLang), else ``/props``'s
    ``build_info`` as ``llama.cpp BUILD`` (llama.cpp's server has no ``/version``); None when neither answers."""
    for path, key, prefix in (("/version", "version", ""), ("/props", "build_info", "llama.cpp ")):
        try:
            value = json.loads(_get(server_root(base_url) + path, headers)).get(key)
        except (urllib.error.URLError, OSError, json.JSONDecodeError, AttributeError):
            continue
        if value:
            return f"{prefix}{value}"
    return None


@register_engine
class OpenAIEngine(Engine):
    name = "openai"

    def __init__(self, options: EngineOptions):
        super().__init__(options)
        self.models: list[dict[str, Any]] = []

    def default_drafters(self, target: str) -> tuple[str, ...]:
        return (self.options.server_label or DEFAULT_LABEL,)

    def headers(self) -> dict[str, str]:
        try:
            return api_key_headers(self.options.api_key_env)
        except ServerError as exc:
            raise EngineError(str(exc)) from None

    def prepare(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path, say: Callable[[str], None]) -> RunSpec:
        base = self.options.base_url
        if not base or not base.startswith(("http://", "https://")):
            raise EngineError(f"--engine openai needs --base-url http(s)://HOST:PORT/v1, got {base!r}")
        if len(spec.drafters) != 1:
            raise EngineError(f"--engine openai decodes the server's one configuration; give one label with "
                              f"--server-label (or --drafter), not {', '.join(spec.drafters)}")
        if spec.scheduler != "fixed" or spec.scheduler_options or spec.profile:
            raise EngineError("--engine openai: the server decides how many drafts it verifies; drop --scheduler")
        if spec.truncate:
            raise EngineError("--engine openai sends text: --truncate cuts token ids and is not available here")
        if spec.repeats != 1:
            raise EngineError("--engine openai sends each prompt once; --repeats is for our engine's timing repeats")
        self.models = self._models(base)
        served = [m.get("id") for m in self.models]
        model = self.options.model or (served[0] if served else None)
        if model not in served:
            raise EngineError(f"{base}/models serves {', '.join(map(str, served)) or 'no model'}; --model {model!r} "
                              f"is not among them")
        self.model, self.dialect = model, dialect_of(self.models)
        say(f"server {base}: model {model} ({self.dialect} dialect)")
        return spec

    def _models(self, base: str) -> list[dict[str, Any]]:
        try:
            data = json.loads(_get(base.rstrip("/") + "/models", self.headers()))
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            raise EngineError(f"cannot reach an OpenAI-compatible server at {base} ({exc}); is it running, and "
                              f"does the URL end in /v1?") from None
        return list(data.get("data") or [])

    def _counters(self) -> dict[str, Any] | None:
        try:
            return spec_counters(_get(server_root(self.options.base_url) + "/metrics", self.headers()))
        except (urllib.error.URLError, OSError):
            return None

    def _version(self) -> str | None:
        """``/version`` (vLLM, SGLang), else llama.cpp's build from ``/props``; None when neither says."""
        return server_version(self.options.base_url, self.headers())

    def run(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path,
            on_record: Callable[[RequestRecord], None], say: Callable[[str], None]) -> dict:
        label = spec.drafters[0]
        arrivals = _schedule(spec, len(prompts))
        requests = [ChatRequest(i, p.text, spec.seed + p.index, arrivals[i]) for i, p in enumerate(prompts)]
        sampling = Sampling(self.model, spec.max_new_tokens, spec.temperature, top_p=spec.top_p, top_k=spec.top_k,
                            min_p=spec.min_p, dialect=self.dialect)
        cap = spec.max_concurrency if spec.request_rate is not None else spec.concurrency
        manifest = self._manifest(spec, prompts, label)
        records: list[RequestRecord] = []
        headers, base = self.headers(), self.options.base_url
        manifest["engine"]["token_ids"] = ids_seen = {"complete": 0, "dropped": 0, "none": 0}
        with RunWriter(folder, manifest) as writer:

            def done(out: Streamed) -> None:
                ids_seen[ids_state(out)] += 1
                rec = to_record(out, prompts[out.index], label, spec, arrivals[out.index])
                writer.add(rec)
                records.append(rec)
                on_record(rec)

            if spec.warmup and requests:
                say("warm-up request (not recorded) ...")
                asyncio.run(stream_all(base, dataclasses.replace(sampling, max_tokens=8),
                                       [ChatRequest(-1, requests[0].text, spec.seed)], 1,
                                       self.options.request_timeout_s, headers))
            before = self._counters()  # after the warm-up: the difference is the run's alone
            asyncio.run(stream_all(base, sampling, requests, cap, self.options.request_timeout_s, headers,
                                   on_done=done))
            after = self._counters()
        return self._finish(spec, folder, manifest, records, before, after)

    def _finish(self, spec, folder, manifest, records, before, after) -> dict:
        delta = counter_delta(before, after) if before is not None and after is not None else None
        totals = sorted({r.spec_totals[0] for r in records if r.spec_totals})
        source = ("vllm-per-request" if any(r.rounds for r in records) else ",".join(totals) if totals
                  else "counters" if delta else "none")
        manifest["engine"].update(counter_delta=delta, metric_source=source,
                                  finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        seen = manifest["engine"].get("token_ids") or {}
        if seen.get("dropped"):
            manifest["engine"]["token_ids_note"] = (
                f"{seen['dropped']} requests returned fewer token ids than their usage counts (llama.cpp, for one, "
                "gives no id for the tokens of a speculative step); their ids were dropped and their token counts "
                "are the server's usage")
        manifest["finished"] = manifest["engine"]["finished"]
        write_json(folder / "manifest.json", manifest)
        summary = summarize(records, spec.block_size)
        summary["serving"] = serving_by_drafter(records, spec.slo or None)
        summary["server_counters"] = counter_summary(delta)
        summary["server_totals"] = {d: totals_summary([r.spec_totals for r in records
                                                       if r.drafter == d and r.ok and r.spec_totals])
                                    for d in sorted({r.drafter for r in records})}
        write_json(folder / SUMMARY, summary)
        return summary

    def _manifest(self, spec: RunSpec, prompts: Sequence[Prompt], label: str) -> dict[str, Any]:
        import dataclasses

        return {
            "schema_version": SCHEMA_VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "args": {**dataclasses.asdict(spec), "engine": self.name},
            "target": {"name": spec.target, "dtype": spec.dtype, "device": "server"},
            "engine": {"name": self.name, "base_url": self.options.base_url, "model": self.model,
                       "models": self.models, "dialect": self.dialect, "version": self._version(), "label": label,
                       "api_key_env": self.options.api_key_env,
                       "arrivals": load_facts(spec)},
            "drafters": {label: {"config": {"server": self.options.base_url}, "scheduler_options": {}}},
            "prompts": [{"dataset": p.dataset, "domain": p.domain, "prompt_id": p.prompt_id, "index": p.index}
                        for p in prompts],
            "seeds": {"base": spec.seed, "per_request": "base + index within dataset (the request's seed field)"},
            **environment(),
        }


def _schedule(spec: RunSpec, n: int) -> tuple[float, ...]:
    arrivals = arrival_schedule(spec)
    return arrivals.times(n) if arrivals else (0.0,) * n


def complete_ids(out: Streamed) -> tuple[int, ...] | None:
    """The response's token ids when they are all of its output tokens, else None. The server's usage count is the
    judge: vLLM returns every token's id; llama.cpp returns an id only beside a text delta, and sends no
    probabilities (so no id) for the tokens of a speculative step, nor a delta for the end-of-sequence token (so a
    request that stopped may lack exactly that one, which carries no output). Ids with others missing would
    misplace every later token, so they are dropped and the usage count stands alone."""
    ids, count = tuple(out.token_ids or ()), out.completion_tokens
    if count is None or len(ids) == count or (out.finish == "stop" and len(ids) == count - 1):
        return ids
    return None


def ids_state(out: Streamed) -> str:
    """``complete``, ``dropped`` (:func:`complete_ids`) or ``none`` (the server returned no ids)."""
    return "none" if out.token_ids is None else "complete" if complete_ids(out) is not None else "dropped"


def to_record(out: Streamed, prompt: Prompt, label: str, spec: RunSpec, arrival_s: float) -> RequestRecord:
    """One response as a record (see the module docstring for what each time means)."""
    known = complete_ids(out)
    ids = known or ()
    n = len(ids) or (out.completion_tokens or 0)
    rounds, _ = rounds_from_stats(out.server_stats, n) if out.status == "ok" else (None, "none")
    totals = totals_from_stats(out.server_stats, n) if out.status == "ok" and rounds is None else None
    first, last = out.first_s, out.last_s
    gaps = tuple(b[0] - a[0] for a, b in zip(out.deliveries, out.deliveries[1:], strict=False))
    ok = out.status == "ok" and first is not None
    return RequestRecord(
        drafter=label, scheduler="server", dataset=prompt.dataset, domain=prompt.domain, prompt_id=prompt.prompt_id,
        index=prompt.index, repeat=0, seed=spec.seed + prompt.index, concurrency=spec.concurrency,
        status="ok" if ok else "error", finish="eos" if out.finish == "stop" else (out.finish or "error"),
        prompt_len=out.prompt_tokens or 0, output_ids=ids, rounds=rounds or (), timings=(),
        ttft_s=(first - out.sent_s) if first is not None else 0.0,
        decode_s=(last - first) if ok else 0.0,
        error=None if ok else (out.error or "no output"),
        arrival_s=arrival_s, queue_s=max(out.sent_s - arrival_s, 0.0), itl_s=gaps,
        e2el_s=(last - arrival_s) if last is not None else None, spec_totals=totals,
        output_tokens=n if known is None and ok else None)


def counter_summary(delta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's speculative totals from the server's counters: drafts, draft and accepted tokens, the mean
    accepted length per draft (``accepted / drafts + 1``, vLLM's acceptance length) and the per-position rate."""
    if not delta or not delta.get("num_drafts"):
        return None
    drafts = delta["num_drafts"]
    return {**delta, "acceptance_length": 1 + delta["num_accepted_tokens"] / drafts,
            "acceptance_rate": (delta["num_accepted_tokens"] / delta["num_draft_tokens"]
                                if delta["num_draft_tokens"] else None),
            "per_position": [a / drafts for a in delta.get("accepted_per_pos", [])]}

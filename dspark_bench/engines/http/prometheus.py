"""A server's Prometheus text (``GET /metrics``), read into the speculative counters our records use.

vLLM exposes ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="j"}`` (one series per
engine and model; summed here). Their differences around a run give its drafts, draft tokens and accepted tokens
(:func:`dspark_bench.engines.vllm.llm.counter_delta`), the source of last resort for a server that returns no
per-request speculative statistics. SGLang's ``sglang:spec_accept_length`` is a gauge (a running mean), kept as is.
"""

from __future__ import annotations

import math
import re
from typing import Any

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
VLLM_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition text as (name, labels, value); comments and malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        out.append((m["name"], dict(_LABEL.findall(m["labels"] or "")), value))
    return out


def spec_counters(text: str) -> dict[str, Any] | None:
    """vLLM's speculative counters in the form of :func:`~dspark_bench.engines.vllm.llm.counter_values`, or None
    when the server exposes none (no speculation configured, or not vLLM)."""
    samples = parse_prometheus(text)
    out: dict[str, Any] = {k: 0 for k in VLLM_COUNTERS}
    per_pos: dict[int, int] = {}
    seen = False
    for name, labels, value in samples:
        key = name.removeprefix("vllm:spec_decode_").removesuffix("_total")
        if not name.startswith("vllm:spec_decode_") or math.isnan(value):
            continue
        seen = True
        if key in VLLM_COUNTERS:
            out[key] += int(value)
        elif key == "num_accepted_tokens_per_pos" and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0) + int(value)
    if not seen:
        return None
    out["accepted_per_pos"] = [per_pos.get(j, 0) for j in range(max(per_pos) + 1)] if per_pos else []
    return out


def sglang_accept_length(text: str) -> float | None:
    """SGLang's running mean accepted length (``sglang:spec_accept_length``), if the server exposes it."""
    values = [v for name, _, v in parse_prometheus(text) if name == "sglang:spec_accept_length"]
    return sum(values) / len(values) if values else None

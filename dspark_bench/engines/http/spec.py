"""A server's per-request speculative statistics, read into our rounds ``[proposed, verified, accepted, committed]``.

The most exact source a server offers wins, and the manifest names it:

* ``vllm-per-request``: vLLM started with ``--per-request-spec-decode-metrics detailed`` returns each request's
  ``per_step_drafted`` / ``per_step_accepted``: rounds exact and in order
  (:func:`~dspark_bench.engines.vllm.llm.rounds_from_steps`);
* ``none``: no per-request rounds; the run's τ then comes from the server's counters around the run
  (:mod:`dspark_bench.engines.http.prometheus`), per run, not per request.

SGLang's ``meta_info.spec_verify_ct`` and llama.cpp's ``timings.draft_n`` give per-request totals, not rounds;
they are kept raw in the run's responses and not turned into rounds (spreading totals over steps would invent the
per-position acceptance our metrics report).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dspark_bench.engines.vllm.llm import rounds_from_steps

Rounds = tuple[tuple[int, int, int, int], ...]


def _find(stats: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """The first mapping holding ``key``, searched breadth-first through nested mappings."""
    queue = [stats]
    while queue:
        item = queue.pop(0)
        if key in item:
            return item
        queue += [v for v in item.values() if isinstance(v, Mapping)]
    return None


def rounds_from_stats(stats: Mapping[str, Any] | None, n_output: int) -> tuple[Rounds | None, str]:
    """(rounds, source) of one request; (None, "none") when the statistics say nothing we can read."""
    if not stats or n_output < 1:
        return None, "none"
    vllm = _find(stats, "per_step_drafted")
    if vllm is not None and "per_step_accepted" in vllm:
        return rounds_from_steps(vllm["per_step_drafted"], vllm["per_step_accepted"], n_output), "vllm-per-request"
    return None, "none"

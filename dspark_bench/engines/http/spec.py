"""A server's per-request speculative statistics, read into our rounds ``[proposed, verified, accepted, committed]``.

The most exact source a server offers wins, and the manifest names it:

* ``vllm-per-request``: vLLM started with ``--per-request-spec-decode-metrics detailed`` returns each request's
  ``per_step_drafted`` / ``per_step_accepted``: rounds exact and in order
  (:func:`~dspark_bench.engines.vllm.llm.rounds_from_steps`);
* per-request totals, not steps (:func:`totals_from_stats`): ``sglang-meta-info`` (SGLang's ``meta_info``:
  ``spec_verify_ct`` verify steps, ``spec_accept_token_num`` / ``spec_draft_token_num`` where its version gives
  them), ``llama.cpp-timings`` (``timings.draft_n`` / ``draft_n_accepted``, left out by llama.cpp where a request
  drafted nothing: 0) and ``vllm-summary`` (vLLM's
  ``--per-request-spec-decode-metrics`` without ``detailed``). They give each request's τ and acceptance rate but
  not rounds: spreading totals over steps would invent the per-position acceptance our metrics report;
* ``none``: nothing per request; the run's τ then comes from the server's counters around the run
  (:mod:`dspark_bench.engines.http.prometheus`), per run, not per request.

τ from totals is ours: output tokens after the first (prefill's) per step after prefill, each step committing its
accepted drafts and one token of the target's, so steps = ``n - 1 - accepted``. (SGLang's own accept length is
``completion_tokens / spec_verify_ct``, which counts the prefill's token too.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def drafted_tokens(stats: Mapping[str, Any] | None, n_output: int) -> int | None:
    """Output tokens of one request committed by steps that verified a draft, or None when the statistics do not
    say. From vLLM's ordered step counts when present, else from its per-request summary (``num_spec_steps``
    steps, each committing its accepted drafts and one more token); at most ``n_output - 1`` (the first token is
    prefill's; tokens a last step accepted past ``max_tokens`` were dropped). From llama.cpp's timings, a lower
    bound: its accepted draft tokens (each verifying step commits one more token of the target's, and llama.cpp
    does not say how many steps verified), so a check that needs this many never overstates its power."""
    rounds, _ = rounds_from_stats(stats, n_output)
    if rounds is not None:
        return sum(r[3] for r in rounds if r[1] > 0)
    summary = _find(stats, "num_spec_steps") if stats else None
    if summary is None or "num_accepted_draft_tokens" not in summary:
        totals = totals_from_stats(stats, n_output)
        return totals[2] if totals is not None and totals[0] == "llama.cpp-timings" else None
    return min(int(summary["num_spec_steps"]) + int(summary["num_accepted_draft_tokens"]), max(n_output - 1, 0))


# (source, output tokens, accepted draft tokens, drafted tokens or None where the server does not say)
Totals = tuple[str, int, int, int | None]


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def totals_from_stats(stats: Mapping[str, Any] | None, n_output: int) -> Totals | None:
    """One request's speculative totals from a server that gives totals instead of steps; None when it gives steps
    (vLLM ``detailed``: :func:`rounds_from_stats`) or nothing we can read. Accepted tokens are capped at
    ``n_output - 1`` (a last step may accept past ``max_tokens``)."""
    if not stats or n_output < 1 or _find(stats, "per_step_drafted") is not None:
        return None
    cap = n_output - 1
    meta = stats.get("meta_info")
    if isinstance(meta, Mapping) and (_int(meta.get("spec_verify_ct")) or 0) > 0:  # 0: no speculation ran
        accepted = _int(meta.get("spec_accept_token_num"))
        if accepted is None:  # older SGLang: every verify step commits its accepted drafts and one token
            accepted = cap - _int(meta["spec_verify_ct"])
        return "sglang-meta-info", n_output, min(max(accepted, 0), cap), _int(meta.get("spec_draft_token_num"))
    timings = stats.get("timings")
    if isinstance(timings, Mapping) and ("draft_n" in timings or "predicted_n" in timings):  # draft_n: if it drafted
        accepted = _int(timings.get("draft_n_accepted")) or 0
        return "llama.cpp-timings", n_output, min(max(accepted, 0), cap), _int(timings.get("draft_n")) or 0
    summary = _find(stats, "num_spec_steps")
    if summary is not None and _int(summary.get("num_accepted_draft_tokens")) is not None:
        accepted = _int(summary["num_accepted_draft_tokens"])
        return "vllm-summary", n_output, min(max(accepted, 0), cap), _int(summary.get("num_draft_tokens"))
    return None


def totals_summary(rows: Sequence[Totals]) -> dict[str, Any] | None:
    """A label's speculative figures from its requests' totals: requests, accepted and drafted tokens, steps after
    prefill, τ (tokens after the first per step) and the acceptance rate (None where a request did not say what it
    drafted). None without rows."""
    if not rows:
        return None
    accepted = sum(t[2] for t in rows)
    committed = sum(max(t[1] - 1, 0) for t in rows)
    steps = committed - accepted
    drafted = None if any(t[3] is None for t in rows) else sum(t[3] for t in rows)
    return {"source": ",".join(sorted({t[0] for t in rows})), "requests": len(rows), "accepted": accepted,
            "drafted": drafted, "steps": steps, "tau": committed / steps if steps else None,
            "acceptance_rate": accepted / drafted if drafted else None}

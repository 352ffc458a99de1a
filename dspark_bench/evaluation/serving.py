"""Serving metrics, defined once, with ``vllm bench serve``'s names: pure functions over request records.

Per request (fields of :class:`~dspark_bench.core.records.RequestRecord`; seconds in records, milliseconds in
the summary, as serving tools print them). Every latency starts at the request's **arrival**, its time on the
seeded schedule, and both engines that take arrivals record them so:

* **queue** = ``queue_s``: arrival to admission. Our engine (``--engine dspark``): the wait for a slot in the
  batch (``--max-concurrency`` full), which ends at the first round boundary after a slot frees; the server
  engine: the wait for the client's ``--max-concurrency`` cap (the server's own queue is inside its ``ttft_s``).
* **ttft** = ``queue_s + ttft_s``: arrival to the first token, as a user sees it; ``ttft_s`` alone starts at
  admission (ours: prefill, first token and the drafter's prompt processing; the server's: from sending).
  ``vllm bench serve`` starts its clock when it sends a request, which is the request's arrival whenever no
  ``--max-concurrency`` holds it back: then the two agree.
* **e2el** = ``e2el_s``: arrival to the last token = queue + ttft_s + the decode that follows.
* **tpot** = (e2el - ttft) / (output tokens - 1): the mean time per output token after the first (vLLM's
  formula); undefined for a one-token output.
* **itl**: every gap between successive *deliveries* of tokens after the first, pooled over requests. Under
  speculative decoding a delivery carries several tokens: a streamed chunk of the server, one round's accepted
  tokens and bonus in our engine (the first delivery ends the admission, then one per round the request took
  part in). The gap is charged to the delivery, not divided among its tokens, which is what ``vllm bench serve``
  records per chunk; so ITL is bursty where TPOT is smooth, and TPOT, not ITL, is the per-token speed.

Per run and drafter (:func:`serving_by_drafter`; one session, one clock each), over the completed (``ok``)
requests:

* **duration** = last completion - first arrival (completion = ``arrival_s + e2el_s``);
* **request_throughput** = completed / duration; **output_throughput** = output tokens / duration (the system's
  tokens/s under this load);
* **per_user_tokens_per_s** = 1000 / ``mean_tpot_ms``: the token rate of one user's stream after its first token;
* **request_goodput** = requests meeting every given SLO / duration (an SLO is a bound in ms on ttft, tpot or
  e2el; a request whose tpot is undefined meets a tpot SLO);
* each latency as mean, median, p90 and p99 (``mean_ttft_ms``, ``median_ttft_ms``, ``p90_ttft_ms``, ...);
* **failed**: requests that carry an arrival and did not complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dspark_bench.core.records import RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2el")
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queue")
STATS = (("mean", None), ("median", 50), ("p90", 90), ("p99", 99))


def parse_slo(text: str) -> dict[str, float]:
    """``--slo ttft=MS,tpot=MS,e2el=MS`` (any subset) into {metric: milliseconds}."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--slo {item!r}: expected METRIC=MS with METRIC one of {', '.join(SLO_METRICS)}, "
                             f"e.g. --slo ttft=500,tpot=50")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"--slo {item!r}: {value!r} is not a number of milliseconds") from None
        if not bound > 0 or name in out:
            raise ValueError(f"--slo {item!r}: give each metric once, with a positive bound in milliseconds")
        out[name] = bound
    if not out:
        raise ValueError(f"--slo {text!r} names no SLO; e.g. --slo ttft=500,tpot=50,e2el=10000")
    return out


def request_latencies(rec: RequestRecord) -> dict[str, float | None]:
    """One request's ttft, tpot, e2el and queue in seconds (None where the record cannot give it)."""
    if rec.arrival_s is None or rec.e2el_s is None:
        return {"ttft": None, "tpot": None, "e2el": None, "queue": None}
    queue = rec.queue_s or 0.0
    ttft = queue + rec.ttft_s
    tokens = rec.n_output
    tpot = (rec.e2el_s - ttft) / (tokens - 1) if tokens > 1 else None
    return {"ttft": ttft, "tpot": tpot, "e2el": rec.e2el_s, "queue": queue}


def meets(latency: Mapping[str, float | None], slo: Mapping[str, float]) -> bool:
    """Whether a request's latencies are within every SLO (ms); an undefined tpot meets a tpot bound."""
    for name, bound_ms in slo.items():
        value = latency.get(name)
        if value is None:
            if name == "tpot":
                continue
            return False
        if value * 1000.0 > bound_ms:
            return False
    return True


def _stats(values: Sequence[float], name: str) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    return {f"{label}_{name}_ms": (None if not arr.size else float(arr.mean() if q is None else np.percentile(arr, q)))
            for label, q in STATS}


def serving_summary(records: Sequence[RequestRecord], slo: Mapping[str, float] | None = None) -> dict | None:
    """The serving metrics of the module docstring over ``records`` (one session's: one drafter of one run), or
    None when no record carries serving fields."""
    timed = [r for r in records if r.arrival_s is not None]
    if not timed:
        return None
    done = [r for r in timed if r.ok and r.e2el_s is not None]
    lat = [request_latencies(r) for r in done]
    start = min(r.arrival_s for r in timed)
    end = max((r.arrival_s + r.e2el_s for r in done), default=start)
    duration = end - start
    out: dict = {"completed": len(done), "failed": len(timed) - len(done), "duration_s": duration,
                 "output_tokens": sum(r.n_output for r in done)}
    out["request_throughput"] = len(done) / duration if duration > 0 else None
    out["output_throughput"] = out["output_tokens"] / duration if duration > 0 else None
    for name in LATENCIES:
        values = ([g for r in done for g in (r.itl_s or ())] if name == "itl"
                  else [x[name] for x in lat if x[name] is not None])
        out.update(_stats(values, name))
    mean_tpot = out["mean_tpot_ms"]
    out["per_user_tokens_per_s"] = 1000.0 / mean_tpot if mean_tpot else None
    if slo:
        good = sum(meets(x, slo) for x in lat)
        out["slo_ms"] = dict(slo)
        out["good_requests"] = good
        out["request_goodput"] = good / duration if duration > 0 else None
    return out


def serving_by_drafter(records: Sequence[RequestRecord], slo: Mapping[str, float] | None = None) -> dict | None:
    """``summary.json``'s ``serving`` block: {drafter: :func:`serving_summary` of its records}, or None when no
    record carries serving fields (closed-loop load). Drafters are apart because each decodes on its own clock."""
    names = dict.fromkeys(r.drafter for r in records if r.arrival_s is not None)
    if not names:
        return None
    return {name: serving_summary([r for r in records if r.drafter == name], slo) for name in names}

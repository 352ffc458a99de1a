"""What an engine yields per request: :class:`RequestRecord`, the one record every consumer shares (metrics,
reports, gates, the lossless checks), and its dict form for the run folder's ``records.jsonl``. No I/O here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dspark_bench.core.rounds import RequestResult, Served


class ResultsError(ValueError):
    """A results folder or file that cannot be read."""


@dataclass(frozen=True)
class RequestRecord:
    """One drafter x request (x repeat). ``rounds`` rows: [proposed, verified, accepted, committed];
    ``timings`` rows: [draft_s, verify_s, other_s, head_s, draft_forward_s, sample_s] (the round's times,
    :mod:`dspark_bench.core.rounds`; records written before these were split hold four columns, the fourth the
    drafter's whole sequential stage); ``batch`` and ``waiting``: requests in the batch and still queued, per
    round.

    Serving fields (None where the run had no arrival schedule and no streaming client): ``arrival_s``, when the
    request arrived, in seconds from the run's first arrival; ``queue_s``, arrival to admission (the engine took
    it in); ``itl_s``, the gaps between successive deliveries of output tokens after the first (a delivery may
    carry several tokens: a round's, or a streamed chunk's); ``e2el_s``, arrival to the last token. ``ttft_s``
    stays admission to the first token, so TTFT as a client sees it is ``queue_s + ttft_s``.

    ``spec_totals``: (source, output tokens, accepted draft tokens, drafted tokens or None) where a server gives a
    request's speculative totals but not its steps (:func:`dspark_bench.engines.http.spec.totals_from_stats`);
    ``rounds`` is then empty.

    ``output_tokens``: how many tokens the request emitted, where ``output_ids`` cannot say (a server that returned
    ids for only some of them: they are dropped, :func:`dspark_bench.engines.http.engine.complete_ids`); None:
    ``len(output_ids)``. Read it through :attr:`n_output`."""

    drafter: str
    scheduler: str
    dataset: str
    domain: str
    prompt_id: str
    index: int
    repeat: int
    seed: int
    concurrency: int
    status: str
    finish: str
    prompt_len: int
    output_ids: tuple[int, ...]
    rounds: tuple[tuple[int, int, int, int], ...]
    timings: tuple[tuple[float, float, float, float], ...]
    ttft_s: float
    decode_s: float
    confidence: tuple[tuple[float, ...], ...] | None = None
    batch: tuple[int, ...] | None = None
    error: str | None = None
    waiting: tuple[int, ...] | None = None
    arrival_s: float | None = None
    queue_s: float | None = None
    itl_s: tuple[float, ...] | None = None
    e2el_s: float | None = None
    spec_totals: tuple[str, int, int, int | None] | None = None
    output_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def n_output(self) -> int:
        """Tokens the request emitted (``output_tokens`` where the ids are not all known)."""
        return len(self.output_ids) if self.output_tokens is None else self.output_tokens


def record_from_result(result: RequestResult, drafter: str, scheduler: str, index: int, repeat: int,
                       concurrency: int) -> RequestRecord:
    req = result.request
    rounds = result.rounds
    has_conf = any(r.confidence is not None for r in rounds)
    return RequestRecord(
        drafter=drafter, scheduler=scheduler, dataset=req.dataset, domain=req.domain, prompt_id=req.prompt_id,
        index=index, repeat=repeat, seed=req.seed, concurrency=concurrency, status=result.status,
        finish=result.finish, prompt_len=len(req.prompt_ids), output_ids=tuple(result.output_ids),
        rounds=tuple((r.proposed, r.verified, r.accepted, r.committed) for r in rounds),
        timings=tuple((r.draft_s, r.verify_s, r.other_s, r.head_s, r.draft_forward_s, r.sample_s) for r in rounds),
        ttft_s=result.ttft_s, decode_s=result.decode_s,
        confidence=tuple(tuple(r.confidence or ()) for r in rounds) if has_conf else None,
        batch=tuple(r.batch for r in rounds), error=result.error, waiting=tuple(r.waiting for r in rounds),
        **serving_fields(result.served),
    )


def serving_fields(served: Served | None) -> dict[str, Any]:
    """The record's serving fields from an open-loop request's times (nothing for closed-loop load): queue =
    admission - arrival, ITL = the gaps between its deliveries (a round's tokens arrive together), E2EL = last
    delivery - arrival (None when it failed before its first token)."""
    if served is None:
        return {}
    d = served.delivered_s
    return {"arrival_s": served.arrival_s, "queue_s": served.admitted_s - served.arrival_s,
            "itl_s": tuple(b - a for a, b in zip(d, d[1:], strict=False)),
            "e2el_s": d[-1] - served.arrival_s if d else None}


SERVING_FIELDS = ("arrival_s", "queue_s", "itl_s", "e2el_s")
OPTIONAL_FIELDS = (*SERVING_FIELDS, "spec_totals", "output_tokens")


def record_to_dict(rec: RequestRecord) -> dict[str, Any]:
    """The record as ``records.jsonl`` holds it; serving fields, server totals and a token count apart from the
    ids appear only when set (a closed-loop run's records read as they did before those fields existed)."""
    return {k: v for k, v in dataclasses.asdict(rec).items() if v is not None or k not in OPTIONAL_FIELDS}


def record_from_dict(data: dict[str, Any]) -> RequestRecord:
    names = {f.name for f in dataclasses.fields(RequestRecord)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ResultsError(f"record has unknown keys {unknown}; known: {sorted(names)}")
    fixed = dict(data)
    for key in ("output_ids", "batch", "waiting", "itl_s", "spec_totals"):
        if fixed.get(key) is not None:
            fixed[key] = tuple(fixed[key])
    for key in ("rounds", "timings", "confidence"):
        if fixed.get(key) is not None:
            fixed[key] = tuple(tuple(row) for row in fixed[key])
    try:
        return RequestRecord(**fixed)
    except TypeError as exc:
        raise ResultsError(f"malformed record: {exc}") from None


def record_key(rec: RequestRecord) -> tuple[str, str, str, int]:
    """What identifies a record within one run: (drafter, dataset, prompt id, repeat)."""
    return rec.drafter, rec.dataset, rec.prompt_id, rec.repeat

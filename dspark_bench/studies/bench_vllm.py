"""Our ``none`` beside vLLM's ``none`` (``dspark-bench bench --against vllm``): the same prompts, seeds, dtype and
thread count, timed by one clock in one invocation.

Terms:

* **arm**: one engine decoding without speculation: ``ours`` (the round loop with the drafter that proposes
  nothing, as in :mod:`.bench`) or ``vllm`` (an ``LLM`` without a speculative config, built as ``run --engine vllm``
  builds it: eager mode on CPU).
* **call**: one arm decoding every prompt at concurrency R: ours through one
  :class:`~dspark_bench.engines.native.loop.RoundLoop` (R requests in flight, continuous batching), vLLM in one
  ``LLM.generate`` call with ``max_num_seqs = R`` (its scheduler keeps R in flight).
* **repeat**: one call of each arm, ours first in even repeats and vLLM first in odd ones, so a drift of the
  machine's speed hits both arms alike. Before the repeats of a concurrency each arm makes one untimed warm-up call;
  the vLLM engine of a concurrency is opened before it and stays open across its repeats (its start is never
  timed).
* **settle**: before every timed call the measurement waits until the other processes and threads of this run
  have gone idle (:func:`settle`). vLLM's worker busy-polls its input queue for a second after its last message
  (``busy_loop_s`` of its shared-memory ``MessageQueue``, vLLM 0.32), a full core on this 2-core machine: measured,
  the worker took about 0.5 s of CPU in each of the two half-seconds after a ``generate`` call and none after, and
  our 8-prompt prefill took 1,010-1,139 ms within 0.05 s of a call, 927-939 ms 1-2 s later
  (``baselines/bench-vs-vllm-settle/``).
  Without the wait, our arm paid for vLLM's idle spin in every repeat where it ran second. Each repeat records the
  seconds waited (``settle_s``).

Per call (:func:`call_numbers`), over the call's requests that ended without error:

* **per_request_tokens_per_s** = :func:`~dspark_bench.evaluation.metrics.tokens_per_s`: decode tokens over decode
  seconds, pooled over requests (ours: the sum of a request's rounds; vLLM: ``last_token_ts - first_token_ts``).
* **system_tokens_per_s** = output tokens / wall seconds of the call (prefill included): vLLM's run summary's
  definition, on the same clock around both arms.
* **ttft_p50_s** = the median TTFT (admission to the first token in both engines).
* **overhead_share** (ours only): the round loop's share of decode time outside model forwards
  (:func:`~dspark_bench.evaluation.metrics.time_shares`).

Per repeat, the ratio ours / vLLM of each number (TTFT too: there lower is better); per concurrency, the median,
min and max over repeats of each arm's numbers and of the ratios (:func:`compare`). The goals (:data:`GOALS`) are
read on the median ratios; ``every_repeat`` says whether each repeat met them too.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.records import RequestRecord, record_from_result
from dspark_bench.core.rounds import Request, RequestResult
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop
from dspark_bench.engines.vllm.llm import VllmRequest, descendants, proc_stat
from dspark_bench.evaluation.metrics import time_shares, tokens_per_s
from dspark_bench.studies.bench import BenchSpec, timed
from dspark_bench.target.model import Target

VS_VLLM_JSON = "vs-vllm.json"
VS_VLLM_MD = "vs-vllm.md"
ARMS = ("ours", "vllm")
NUMBERS = ("per_request_tokens_per_s", "system_tokens_per_s", "ttft_p50_s")
WARMUP_TOKENS = 8
SETTLE_QUIET_S = 0.2  # settle(): this long with at most one CPU tick used by the run's other processes and threads
SETTLE_CAP_S = 10.0  # settle() gives up after this long (recorded: a run that never went quiet)


@dataclass(frozen=True)
class Goal:
    """Ours / vLLM of ``metric`` at least (``at_least``) or at most 1.0, at the concurrency levels ``levels``
    (empty: every level)."""

    metric: str
    levels: tuple[int, ...]
    at_least: bool

    def applies(self, concurrency: int) -> bool:
        return not self.levels or concurrency in self.levels

    def met(self, ratio: float | None) -> bool | None:
        if ratio is None:
            return None
        return ratio >= 1.0 if self.at_least else ratio <= 1.0


GOALS = (Goal("per_request_tokens_per_s", (1,), True), Goal("system_tokens_per_s", (8, 32), True),
         Goal("ttft_p50_s", (), False))


# ---- the math (pure) ------------------------------------------------------------------------------------------
def call_numbers(records: Sequence[RequestRecord], wall_s: float) -> dict[str, Any]:
    """The numbers of one call (module docstring) from its records and its wall seconds."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(len(r.output_ids) for r in ok)
    return {"per_request_tokens_per_s": tokens_per_s(ok),
            "system_tokens_per_s": out_tokens / wall_s if wall_s > 0 and ok else None,
            "ttft_p50_s": statistics.median(r.ttft_s for r in ok) if ok else None,
            "overhead_share": time_shares(ok)["overhead_share"],
            "output_tokens": out_tokens, "requests": len(ok), "errors": len(records) - len(ok), "wall_s": wall_s}


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, min and max of the values that are not None (all None without any)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept)}


def ratios(ours: Mapping[str, Any], vllm: Mapping[str, Any]) -> dict[str, float | None]:
    """Ours / vLLM of each of :data:`NUMBERS` in one repeat (None where either is missing or vLLM's is 0)."""
    return {k: ours[k] / vllm[k] if ours.get(k) is not None and vllm.get(k) else None for k in NUMBERS}


def compare(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One concurrency's summary from its repeats (each ``{"ours": numbers, "vllm": numbers}``): per arm and for
    the ratios, :func:`spread` over repeats of each number."""
    rows = [{**rep, "ratio": ratios(rep["ours"], rep["vllm"])} for rep in repeats]
    out: dict[str, Any] = {"repeats": rows}
    for arm in ARMS:
        out[arm] = {k: spread([r[arm][k] for r in rows]) for k in (*NUMBERS, "overhead_share")}
    out["ratio"] = {k: {**spread([r["ratio"][k] for r in rows]), "per_repeat": [r["ratio"][k] for r in rows]}
                    for k in NUMBERS}
    return out


def goals(levels: Mapping[str, Mapping[str, Any]], targets: Sequence[Goal] = GOALS) -> list[dict[str, Any]]:
    """Each goal at each concurrency it applies to: the median ratio, whether it is met, and whether every repeat
    met it (both None where a ratio is missing)."""
    out = []
    for conc, level in levels.items():
        for goal in targets:
            if not goal.applies(int(conc)):
                continue
            ratio = level["ratio"][goal.metric]
            each = [goal.met(r) for r in ratio["per_repeat"]]
            out.append({"metric": goal.metric, "concurrency": int(conc), "goal": (">= 1.0" if goal.at_least
                                                                                 else "<= 1.0"),
                        "ratio_median": ratio["median"], "met": goal.met(ratio["median"]),
                        "every_repeat": None if None in each else all(each)})
    return out


def markdown(result: Mapping[str, Any], title: str) -> str:
    """The result as a markdown table: per concurrency and number, each arm's median [min-max] and the ratio's."""
    def cell(s: Mapping[str, Any], spec: str) -> str:
        if s["median"] is None:
            return "–"
        return f"{s['median']:{spec}} [{s['min']:{spec}}-{s['max']:{spec}}]"

    waits = [w for level in result["levels"].values() for rep in level["repeats"]
             for w in rep.get("settle_s", {}).values() if w is not None]
    settled = ("" if not waits else f" Before each timed call the run waited for its other processes and threads to "
               f"go idle (vLLM's worker spins for a second after a call): {statistics.median(waits):.2f} s median, "
               f"{max(waits):.2f} s at most.")
    lines = [f"# {title}", "", "Medians over repeats [min-max]. Ratio = ours / vLLM (TTFT: lower is better)." + settled,
             "", "| c | number | ours | vLLM | ours / vLLM |", "|---:|---|---:|---:|---:|"]
    for conc, level in result["levels"].items():
        for k, spec in zip(NUMBERS, (".1f", ".1f", ".4f"), strict=True):
            lines.append(f"| {conc} | {k} | {cell(level['ours'][k], spec)} | {cell(level['vllm'][k], spec)} | "
                         f"{cell(level['ratio'][k], '.3f')} |")
        lines.append(f"| {conc} | ours overhead_share | {cell(level['ours']['overhead_share'], '.2%')} | | |")
    lines += ["", "| goal | c | median ratio | met | every repeat |", "|---|---:|---:|---|---|"]
    for g in result["goals"]:
        median = "–" if g["ratio_median"] is None else f"{g['ratio_median']:.3f}"
        lines.append(f"| {g['metric']} {g['goal']} | {g['concurrency']} | {median} | {_yes(g['met'])} | "
                     f"{_yes(g['every_repeat'])} |")
    return "\n".join(lines) + "\n"


def _yes(flag: bool | None) -> str:
    return "–" if flag is None else ("yes" if flag else "**no**")


# ---- the measurement ------------------------------------------------------------------------------------------
class VllmArm(Protocol):
    """What the measurement needs of vLLM's engine (:class:`~dspark_bench.engines.vllm.llm.VllmLLM`)."""

    wall_s: float

    def run(self, group, sampling, max_new_tokens: int, repeat: int, concurrency: int) -> list[RequestRecord]: ...

    def close(self) -> None: ...


def vllm_requests_of(requests: Sequence[Request]) -> list[VllmRequest]:
    """vLLM's requests for ours: the same token ids and seeds (record index = our request id)."""
    return [VllmRequest(r.prompt_ids, r.seed, r.dataset, r.domain, r.prompt_id, r.request_id) for r in requests]


def busy_ticks(proc: Path = Path("/proc")) -> int | None:
    """CPU clock ticks (user + system) used so far by this process's descendants (vLLM's engine core and workers,
    every thread) and by this process's threads other than the calling one; None where there is no ``/proc``."""
    if not (proc / "self" / "task").is_dir():
        return None
    me, caller = os.getpid(), str(threading.get_native_id())
    total = 0
    for pid in (me, *descendants(proc)):
        for task in (proc / str(pid) / "task").glob("*"):
            if not (pid == me and task.name == caller) and (got := proc_stat(task / "stat")) is not None:
                total += int(got[1][11]) + int(got[1][12])
    return total


def settle(quiet_s: float = SETTLE_QUIET_S, cap_s: float = SETTLE_CAP_S, poll_s: float = 0.05,
           ticks: Callable[[], int | None] = busy_ticks, clock: Callable[[], float] = time.perf_counter,
           sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Wait until :func:`busy_ticks` grows by at most one tick over ``quiet_s`` (a thread that spins takes 100
    ticks a second; an idle process's housekeeping threads, a tick now and then), at most ``cap_s`` seconds.
    Returns the seconds waited (``cap_s`` or more: never quiet), None where nothing can be read (no wait)."""
    start = clock()
    since = None  # (time, ticks) when the quiet stretch began
    while True:
        now, used = clock(), ticks()
        if used is None:
            return None
        if since is None or used - since[1] > 1:
            since = (now, used)
        elif now - since[0] >= quiet_s:
            return now - start
        if now - start >= cap_s:
            return now - start
        sleep(poll_s)


def _ours_call(engine: RoundLoop, requests: Sequence[Request], repeat: int) -> tuple[list[RequestRecord], float]:
    results: list[RequestResult] = []

    def decode() -> int:
        engine.run(requests, results.append)
        return len(results)

    _, wall = timed(decode, engine.target.device)
    conc = engine.config.concurrency
    return [record_from_result(r, "none", "fixed", r.request.request_id, repeat, conc) for r in results], wall


def _vllm_call(engine: VllmArm, requests: Sequence[VllmRequest], spec: BenchSpec, repeat: int,
               concurrency: int, max_new_tokens: int | None = None) -> tuple[list[RequestRecord], float]:
    before = engine.wall_s  # VllmLLM times each generate call itself, around nothing else
    records = engine.run(requests, spec.temperature, max_new_tokens or spec.max_new_tokens, repeat, concurrency)
    return records, engine.wall_s - before


def level(target: Target, requests: Sequence[Request], spec: BenchSpec, engine: VllmArm,
          concurrency: int, wait: Callable[[], float | None] = settle) -> dict[str, Any]:
    """One concurrency: the warm-up calls, then ``spec.repeats`` interleaved repeats, each timed call after ``wait``
    (:func:`settle`); :func:`compare`'s summary."""
    config = EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, concurrency)
    ours = RoundLoop(target, drafter_registry.create("none", target), config)
    vreqs = vllm_requests_of(requests)
    warm = RoundLoop(target, ours.drafter, replace(config, max_new_tokens=min(WARMUP_TOKENS, spec.max_new_tokens)))
    _ours_call(warm, requests[:concurrency], -1)  # warm-up, untimed
    _vllm_call(engine, vreqs[:concurrency], spec, -1, concurrency, min(WARMUP_TOKENS, spec.max_new_tokens))
    reps = []
    for rep in range(spec.repeats):
        order = ARMS if rep % 2 == 0 else ARMS[::-1]
        row: dict[str, Any] = {"order": list(order), "settle_s": {}}
        for arm in order:
            row["settle_s"][arm] = wait()
            recs, wall = (_ours_call(ours, requests, rep) if arm == "ours"
                          else _vllm_call(engine, vreqs, spec, rep, concurrency))
            row[arm] = call_numbers(recs, wall)
        reps.append(row)
    return compare(reps)


def run_against_vllm(target: Target, requests: Sequence[Request], spec: BenchSpec,
                     open_vllm: Callable[[int], VllmArm], log: Callable[[str], None] = lambda msg: None,
                     wait: Callable[[], float | None] = settle) -> dict:
    """Every concurrency of ``spec``, each with its own vLLM engine (``open_vllm(R)``: ``max_num_seqs = R``),
    closed before the next one opens; returns a JSON-ready dict (``levels``, ``goals``). ``wait`` runs before every
    timed call (:func:`settle`)."""
    out: dict[str, Any] = {"spec": asdict(spec), "prompts": len(requests), "levels": {}}
    for conc in spec.concurrency:
        t0 = time.perf_counter()
        engine = open_vllm(conc)
        log(f"c={conc}: vLLM started in {time.perf_counter() - t0:.0f} s")
        try:
            out["levels"][str(conc)] = level(target, requests, spec, engine, conc, wait)
        finally:
            engine.close()
        r = out["levels"][str(conc)]["ratio"]
        log(f"c={conc}: ours / vLLM " + ", ".join(f"{k} {_x(r[k]['median'])}" for k in NUMBERS))
    out["goals"] = goals(out["levels"])
    return out


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}x"

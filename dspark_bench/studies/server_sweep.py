"""The request-rate sweep against OpenAI-compatible servers: each server is one method, named by its label.

A deployed engine runs one speculative configuration per server process (vLLM's ``--speculative-config``, SGLang's
``--speculative-algorithm``), so the methods of a server sweep are servers: ``--server none=URL`` (no speculation,
the baseline), ``--server ngram=URL``, ``--server eagle3=URL``... At each offered rate every server receives the
same prompts with the same per-request seeds on the same seeded arrival schedule, one server at a time (the order
reversed at every other rate, so slow drift of the machine does not always favour the same server), through the
OpenAI engine (:mod:`dspark_bench.engines.http.engine`). Each cell is a normal run folder
``cells/<label>__server__r<rate>/run``; ``sweep.json`` has the rows and the ``serving`` block of a request-rate
sweep through our engine (:mod:`dspark_bench.studies.serving_sweep`, with the baseline server's method
``"<label> server"``), so ``report`` renders both alike.

A finished cell (its ``summary.json`` written) is kept when the sweep runs again into the same folder; a cell that
an interruption left without one is moved aside to ``run.partial-<n>`` (kept, never deleted) and run again whole:
an arrival schedule cannot be resumed half way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_bench.engines.base import EngineOptions, RunSpec
from dspark_bench.engines.http.engine import OpenAIEngine
from dspark_bench.evaluation.runs import SUMMARY, read_records, write_json
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.studies.sweep import SWEEP_JSON, SweepSpec, serving_block, serving_row, sweep_row

SCHEDULER = "server"  # the rows' scheduler label: the server decides what it verifies
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Server:
    label: str
    base_url: str


def parse_servers(items: Sequence[str]) -> tuple[Server, ...]:
    """``LABEL=URL`` items as servers; a bad item, a repeated label or URL is refused (ValueError, naming it)."""
    servers: list[Server] = []
    for item in items:
        label, sep, url = item.partition("=")
        label, url = label.strip(), url.strip()
        if not sep or not _LABEL.match(label) or not url.startswith(("http://", "https://")):
            raise ValueError(f"--server {item!r}: give LABEL=URL, a label of letters, digits, '.', '_' or '-' and "
                             "the server's OpenAI base URL, e.g. none=http://127.0.0.1:8000/v1")
        if any(s.label == label for s in servers) or any(s.base_url == url for s in servers):
            raise ValueError(f"--server {item!r}: every server needs its own label and URL")
        servers.append(Server(label, url))
    if not servers:
        raise ValueError("a server sweep needs at least one --server LABEL=URL")
    return tuple(servers)


def cell_folder(server: Server, rate: float) -> str:
    return f"{server.label}__{SCHEDULER}__r{rate:g}"


def run_server_sweep(spec: SweepSpec, servers: Sequence[Server], options: EngineOptions, prompts: Sequence[Prompt],
                     out: str | Path, baseline: str, on_cell: Callable[[dict], None] = lambda row: None,
                     say: Callable[[str], None] = lambda text: None) -> dict:
    """Every server at every rate of ``spec.request_rates`` (module docstring); writes ``sweep.json`` after each
    rate and returns it. ``options`` carries what the servers share (model, API key variable, request timeout);
    ``baseline`` is the label of the server the others are compared with."""
    if not spec.request_rates:
        raise ValueError("a server sweep is a request-rate sweep: give --request-rate")
    if baseline not in {s.label for s in servers}:
        raise ValueError(f"the baseline {baseline!r} is not a server label ({', '.join(s.label for s in servers)}); "
                         "name the server without speculation --server none=URL, or pick one with --baseline LABEL")
    out, rows = Path(out), []
    for i, rate in enumerate(spec.request_rates):
        for server in servers if i % 2 == 0 else tuple(reversed(servers)):
            folder = out / "cells" / cell_folder(server, rate) / "run"
            if not (folder / SUMMARY).exists():
                _set_aside(folder, say)
                engine = OpenAIEngine(dataclasses.replace(options, base_url=server.base_url,
                                                          server_label=server.label))
                run_spec = engine.prepare(_run_spec(spec, server.label, rate), prompts, folder, say)
                engine.run(run_spec, prompts, folder, lambda record: None, say)
            else:
                say(f"{server.label} at {rate:g} req/s: kept from an earlier sweep ({folder})")
            records = read_records(folder)
            rows.append({"drafter": server.label, "scheduler": SCHEDULER, "label": SCHEDULER,
                         "concurrency": spec.max_concurrency or 0, "options": {"base_url": server.base_url},
                         **sweep_row(records, spec.block_size), "request_rate": rate,
                         **serving_row(records, spec.slo), "folder": f"cells/{cell_folder(server, rate)}"})
            on_cell(rows[-1])
        result = {"spec": {**dataclasses.asdict(spec), "servers": {s.label: s.base_url for s in servers},
                           "baseline_server": baseline},
                  "profile": None, "rows": rows, "comparisons": [],
                  "serving": serving_block(rows, spec.slo, f"{baseline} {SCHEDULER}")}
        write_json(out / SWEEP_JSON, result)
    return result


def _run_spec(spec: SweepSpec, label: str, rate: float) -> RunSpec:
    return RunSpec(target=spec.target, drafters=(label,), suite=spec.suite, limit=spec.limit,
                   max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
                   top_k=spec.top_k, min_p=spec.min_p, block_size=spec.block_size, seed=spec.seed, dtype=spec.dtype,
                   request_rate=rate, burstiness=spec.burstiness, max_concurrency=spec.max_concurrency,
                   slo=dict(spec.slo))


def _set_aside(folder: Path, say: Callable[[str], None]) -> None:
    """Move a cell an interruption left unfinished to ``run.partial-<n>`` (nothing is deleted)."""
    if not folder.exists():
        return
    n = 1
    while folder.with_name(f"{folder.name}.partial-{n}").exists():
        n += 1
    aside = folder.with_name(f"{folder.name}.partial-{n}")
    folder.rename(aside)
    say(f"an unfinished cell was moved aside to {aside}; it runs again whole")


def servers_of(result: dict[str, Any]) -> dict[str, str]:
    """The servers of a server sweep's ``sweep.json`` (label -> base URL); empty for a sweep of our engine."""
    return dict((result.get("spec") or {}).get("servers") or {})

"""One lossless check per engine, chosen by the engine's name (``check-lossless --engine NAME``).

* ``dspark`` (ours): the battery of :mod:`.battery` over drafters x schedulers, with its negative controls;
* ``vllm``: :mod:`.vllm`'s check of vLLM's configurations (PIT/KS against the teacher-forced target law of the
  same weights, homogeneity against vLLM without speculation), with our shipped Eagle3 exported when asked for;
* ``openai``: :mod:`.server`'s check of a running OpenAI-compatible server's one configuration (PIT/KS and a
  goodness of fit of its first tokens, against the teacher-forced target law of the same weights loaded here).

Each check refuses what its engine cannot take (schedulers for vLLM and servers, vLLM options for ours and for
servers, a server for ours and vLLM's offline engine) and returns a
:class:`Outcome`: the report, what else ``lossless.json`` holds, and the words for its table and verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_bench.lossless.report import BatteryReport

if TYPE_CHECKING:
    from dspark_bench.lossless.server import ServerOptions

Say = Callable[[str], None]


@dataclass(frozen=True)
class Request:
    """What ``check-lossless`` asks: ``drafters`` / ``schedulers`` None for the engine's defaults;
    ``engine_options`` the ``--engine-opt KEY=VALUE`` items; ``folder`` where exported drafters may be written;
    ``server`` the ``--engine openai`` server options (:class:`~.server.ServerOptions`), None for other engines."""

    target: str
    mode: str
    seed: int
    folder: Path
    drafters: tuple[str, ...] | None = None
    schedulers: tuple[str, ...] | None = None
    engine_options: tuple[str, ...] = ()
    server: ServerOptions | None = None


@dataclass(frozen=True)
class Outcome:
    report: BatteryReport
    title: str
    failure: str  # what a failed verdict means for this check
    extra: dict[str, Any] = field(default_factory=dict)  # more of lossless.json (engine facts, evidence)


def refuse_server(req: Request, engine: str) -> None:
    if req.server is not None:
        raise ValueError(f"--base-url names a running server: give it with --engine openai, not --engine {engine}")


def check_native(req: Request, say: Say) -> Outcome:
    from dspark_bench.lossless import battery

    refuse_server(req, "dspark")
    if req.engine_options:
        raise ValueError("--engine-opt configures vLLM: give it with --engine vllm")
    report = battery.run_battery(mode=req.mode, target=req.target, drafters=list(req.drafters) if req.drafters else None,
                                 schedulers=list(req.schedulers) if req.schedulers else None, seed=req.seed,
                                 progress=say)
    return Outcome(report, f"lossless battery ({req.mode}, {req.target}): real configurations must pass, controls "
                           "must fail", "a real configuration failed or a control passed")


def check_vllm(req: Request, say: Say) -> Outcome:
    from dspark_bench.engines.base import RunSpec
    from dspark_bench.engines.vllm.export import with_shipped_exports
    from dspark_bench.engines.vllm.llm import METHODS, VllmError, require_vllm
    from dspark_bench.lossless.vllm import engine_facts, lossless_options, run_vllm_battery
    from dspark_bench.target.model import resolve_target

    refuse_server(req, "vllm")
    if req.schedulers:
        raise ValueError("--scheduler is ours: vLLM verifies every drafted token")
    require_vllm()
    names = list(req.drafters or ("none", "ngram"))
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    fixes, llm_opts = lossless_options(req.engine_options, "check-lossless --engine vllm")
    exports = with_shipped_exports(RunSpec(target=req.target, drafters=tuple(names)), req.folder, say=say)
    report, evidence = run_vllm_battery(req.mode, req.target, names, req.seed, resolve_target(req.target), llm_opts,
                                        progress=say, drafter_options=exports.drafter_options, fixes=fixes)
    facts = engine_facts(fixes, any(n != "none" for n in names), say)
    return Outcome(report, f"vLLM lossless check ({req.mode}, {req.target}): every configuration must pass",
                   "a configuration failed: see its evidence", {"engine": facts, "evidence": evidence})


def check_openai(req: Request, say: Say) -> Outcome:
    from dspark_bench.lossless.server import run_server_battery

    if req.server is None:
        raise ValueError("--engine openai needs --base-url http(s)://HOST:PORT/v1 (the running server to check)")
    if req.schedulers:
        raise ValueError("--scheduler is ours: the server decides how many drafts it verifies")
    if req.engine_options:
        raise ValueError("--engine-opt configures vLLM's offline engine: a server's options are set when it "
                         "starts (describe its speculation with --server-spec)")
    if req.drafters:
        raise ValueError("--drafter picks configurations to start: a server runs the one it was started with "
                         "(describe it with --server-spec)")
    report, extra = run_server_battery(req.mode, req.target, req.seed, req.server, say)
    return Outcome(report, f"server lossless check ({req.mode}, {req.target} at {req.server.base_url}): the "
                           "server's configuration must pass", "the server's configuration failed: see its evidence",
                   extra)


CHECKS: dict[str, Callable[[Request, Say], Outcome]] = {"dspark": check_native, "vllm": check_vllm,
                                                         "openai": check_openai}


def lossless_check(engine: str) -> Callable[[Request, Say], Outcome]:
    if engine not in CHECKS:
        raise ValueError(f"check-lossless has no check for engine {engine!r}; engines: {', '.join(CHECKS)}")
    return CHECKS[engine]

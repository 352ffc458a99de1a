"""A benchmark run: prompts x drafters x repeats through the one engine, recorded as it goes.

**Continuous batching, interleaved round by round.** Every drafter decodes the whole prompt list with its own
engine session holding ``concurrency`` requests in flight: a finished request's slot is refilled from the queue
at once, so the batch stays at R until the queue runs dry (the drain at the end is each drafter's own, one
tail per run rather than one per chunk of R prompts). The sessions of all drafters (and, for a sweep, of all
cells of a concurrency level, :func:`execute_together`) advance in lockstep: one round of each in turn. So
every method is timed side by side with ``none`` on the same prompts under the same machine conditions (load
or thermal drift hits all of them alike, at the granularity of one round), and each one's clock runs only
during its own rounds (a round's times never include another engine's work). Ratios, not absolute times, are
what the summary compares. The price is memory: every drafter's batch is resident at once.

**Open-loop load** (``RunSpec.request_rate``). Request i of the prompt list arrives at time i of the seeded
schedule (:func:`~dspark_bench.engines.base.arrival_schedule`, the server engine's too), and every drafter's
session gets that same schedule: the runner still interleaves the sessions round by round, and each keeps its own
clock from its first step, after the warm-up, running only during its own steps
(:class:`~dspark_bench.core.timing.StepClock`). So each drafter meets the arrivals as if it were alone on the
machine (its rounds back to back, its idle gaps skipped rather than slept), while drift still hits every drafter
alike. Running the drafters one after another on wall clocks would be the alternative; it takes their sum of
wall time (idle waits included) and lets the machine's drift between them into the comparison. At most
``max_concurrency`` requests are in flight (every request when it is None); the summary's ``serving`` block holds
each drafter's serving metrics (:func:`~dspark_bench.evaluation.serving.serving_by_drafter`). An open-loop run
sends each request once (one repeat) and is not resumed: its latencies depend on the whole schedule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.records import RequestRecord, ResultsError, record_from_result, record_key
from dspark_bench.core.rounds import Request, RequestResult
from dspark_bench.drafters import checkpoint
from dspark_bench.engines.base import RunSpec, arrival_schedule, context_of, fit_prompts, load_facts
from dspark_bench.engines.native.loop import EngineConfig, RoundLoop, Session
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import (
    SCHEMA_VERSION,
    SUMMARY,
    RunWriter,
    drop_torn_tail,
    environment,
    read_manifest,
    read_records,
    write_json,
)
from dspark_bench.evaluation.serving import serving_by_drafter
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.scheduling.schedulers import create_scheduler, scheduler_class, with_profile
from dspark_bench.target.model import Target


@dataclass(eq=False)
class _Open:
    """A run in progress: its engines, requests and the records written so far."""

    run: Run
    engines: dict[str, RoundLoop]
    requests: list[Request]
    manifest: dict
    writer: RunWriter
    records: list[RequestRecord] = field(default_factory=list)
    todo: dict[tuple[str, int], list[Request]] | None = None  # resuming: (drafter, repeat) -> requests not recorded

    def sessions(self, repeat: int) -> list[Session]:
        """One session per drafter over all requests, or over those a resumed run lacks (nothing when the run has
        fewer repeats)."""
        if repeat >= self.run.spec.repeats:
            return []
        if self.todo is None:
            return [engine.session(self.requests, self._keep(name, repeat)) for name, engine in self.engines.items()]
        return [engine.session(self.todo[(name, repeat)], self._keep(name, repeat))
                for name, engine in self.engines.items() if self.todo[(name, repeat)]]

    def _keep(self, name: str, repeat: int) -> Callable[[RequestResult], None]:
        spec, index = self.run.spec, {r.request_id: p.index for r, p in zip(self.requests, self.run.prompts,
                                                                          strict=True)}

        def on_result(res: RequestResult) -> None:
            rec = record_from_result(res, name, spec.scheduler, index[res.request.request_id], repeat,
                                     self.run.batch_cap)
            self.writer.add(rec)
            self.records.append(rec)
            self.run.on_record(rec)

        return on_result

    def finish(self) -> dict:
        summary = run_summary(self.records, self.run.spec)
        self.manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if self.todo is not None:
            self.manifest["resumed"][-1]["finished"] = self.manifest["finished"]
            self.manifest["unfinished"] = missing_keys(self.run.spec, self.run.prompts, self.records)
        write_json(self.run.out / "manifest.json", self.manifest)
        write_json(self.run.out / SUMMARY, summary)
        return summary


def execute_together(runs: Sequence[Run]) -> list[dict]:
    """Execute runs on one target with all their drafters' sessions interleaved round by round (module
    docstring), repeat by repeat; returns each run's summary."""
    with ExitStack() as stack:
        opened = [run.open(stack) for run in runs]
        for repeat in range(max((r.spec.repeats for r in runs), default=0)):
            interleave([s for o in opened for s in o.sessions(repeat)])
        return [o.finish() for o in opened]


def resume(folder: Path, target: Target, prompts: Sequence[Prompt],
           on_record: Callable[[RequestRecord], None] = lambda rec: None) -> tuple[dict, int]:
    """Complete a run folder that a crash or a dead worker left short: decode every (drafter, prompt, repeat) it
    holds no record of, with the spec its manifest recorded, append those records, and rewrite the manifest
    (``resumed``: when, records kept, requests decoded; ``unfinished``: what is still missing) and the summary
    over all records. A half-written last record line is cut first. ``prompts`` must be the manifest's. Returns
    (summary, records added). The resumed requests are timed side by side with each other, not with the records
    kept: ratios that mix the two sessions say so through ``resumed``."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    spec = spec_from_manifest(manifest)
    if spec.request_rate is not None:
        raise ResultsError(f"{folder}: an open-loop run (--request-rate) cannot be resumed: its latencies depend on "
                           f"the whole arrival schedule; run it again into a new folder")
    listed = [(p["dataset"], p["prompt_id"]) for p in manifest.get("prompts", [])]
    if listed != [(p.dataset, p.prompt_id) for p in prompts]:
        raise ResultsError(f"{folder}: the suite {spec.suite!r} at --limit {spec.limit} no longer selects the "
                           f"prompts its manifest lists ({len(listed)}); it cannot be resumed with these prompts")
    drop_torn_tail(folder)
    records = read_records(folder)
    run = Run(spec, target, prompts, folder, on_record)
    with ExitStack() as stack:
        opened = run.open(stack, resume=(manifest, records))
        for repeat in range(spec.repeats):
            interleave(opened.sessions(repeat))
        return opened.finish(), len(opened.records) - len(records)


def spec_from_manifest(manifest: dict) -> RunSpec:
    """The :class:`RunSpec` a run's manifest recorded (``args``); fields a newer spec added keep their default."""
    args = manifest.get("args")
    if not isinstance(args, dict):
        raise ResultsError("the manifest has no 'args': not a run of our engine (a vLLM or sweep folder?)")
    known = {f.name for f in dataclasses.fields(RunSpec)}
    values = {k: v for k, v in args.items() if k in known}
    if "drafters" in values:
        values["drafters"] = tuple(values["drafters"])
    return RunSpec(**values)


def missing_keys(spec: RunSpec, prompts: Sequence[Prompt], records: Sequence[RequestRecord]) -> list[dict]:
    """The (dataset, prompt, drafter, repeat) a run of ``spec`` over ``prompts`` should hold and ``records`` lack."""
    done = {record_key(r) for r in records}
    return [{"dataset": p.dataset, "prompt_id": p.prompt_id, "drafter": d, "repeat": k}
            for p in prompts for k in range(spec.repeats) for d in spec.drafters
            if (d, p.dataset, p.prompt_id, k) not in done]


def run_summary(records: Sequence[RequestRecord], spec: RunSpec) -> dict:
    """``summary.json``: the metrics of every drafter, and under open-loop load each one's ``serving`` block."""
    summary = summarize(records, spec.block_size)
    serving = serving_by_drafter(records, spec.slo or None)
    if serving is not None:
        summary["serving"] = serving
    return summary


def check_open_loop(spec: RunSpec) -> None:
    """Refuse what open-loop load does not combine with in our engine (before any model loads)."""
    if spec.request_rate is None:
        return
    if spec.repeats != 1:
        raise ValueError(f"--request-rate sends each request once on its schedule: drop --repeats {spec.repeats} "
                         f"(run again for another sample)")
    if spec.concurrency != 1:
        raise ValueError(f"--concurrency {spec.concurrency} is closed-loop load; with --request-rate cap the "
                         f"requests in flight with --max-concurrency")


def default_drafters(target: str) -> tuple[str, ...]:
    """``none``, ``ngram`` and every model drafter with a shipped checkpoint for ``target``."""
    shipped = [n for n in drafter_registry.names() if checkpoint.shipped_folder(target, n)]
    return ("none", "ngram", *[n for n in shipped if n not in ("none", "ngram")])


def build_requests(target: Target, prompts: Sequence[Prompt], seed: int) -> list[Request]:
    """Render each prompt once; per-request seed = base seed + index within its dataset (reference protocol)."""
    return [
        Request(i, tuple(target.render(p.text)), seed + p.index, p.dataset, p.domain, p.prompt_id)
        for i, p in enumerate(prompts)
    ]


def fit_requests(requests: Sequence[Request], prompts: Sequence[Prompt], spec: RunSpec,
                 target: Target) -> tuple[list[Request], list[dict]]:
    """``requests`` fitted to the target's context (:func:`~dspark_bench.engines.base.fit_prompts`: a prompt too
    long is refused, or cut from the side ``spec.truncate`` names); returns them and the prompts cut."""
    ids, cut = fit_prompts(prompts, [r.prompt_ids for r in requests], spec, context_of(target.config))
    return [dataclasses.replace(r, prompt_ids=x) for r, x in zip(requests, ids, strict=True)], cut


def interleave(sessions: Sequence[Session]) -> None:
    """Step every session in turn, one round each, until all are done."""
    active = list(sessions)
    while active:
        active = [s for s in active if s.step()]


@dataclass(eq=False)
class Run:
    """Executes a :class:`RunSpec` against an already loaded target."""

    spec: RunSpec
    target: Target
    prompts: Sequence[Prompt]
    out: Path
    on_record: Callable[[RequestRecord], None] = lambda rec: None
    resolved_scheduler_options: dict[str, dict[str, str]] = field(default_factory=dict, init=False)
    _measured: dict = field(default_factory=dict, init=False)  # a profile measured for schedulers given none

    @property
    def batch_cap(self) -> int:
        """Requests in flight at most: ``concurrency`` (closed loop), or ``max_concurrency`` under arrivals (every
        request when it is None). Records carry it as their ``concurrency``."""
        if self.spec.request_rate is None:
            return self.spec.concurrency
        return self.spec.max_concurrency or max(len(self.prompts), 1)

    def execute(self) -> dict:
        """Decode, record and summarise; returns the summary."""
        return execute_together([self])[0]

    def open(self, stack: ExitStack, resume: tuple[dict, list[RequestRecord]] | None = None) -> _Open:
        """Engines, requests, manifest and record writer of this run (closed with ``stack``). ``resume``: the
        manifest and records the run folder already holds; only what they lack is decoded (:func:`resume`)."""
        spec = self.spec
        check_open_loop(spec)
        requests, cut = fit_requests(build_requests(self.target, self.prompts, spec.seed), self.prompts, spec,
                                     self.target)
        arrivals = arrival_schedule(spec)
        if arrivals is not None:
            requests = [dataclasses.replace(r, arrival_s=t) for r, t in zip(requests, arrivals.times(len(requests)),
                                                                           strict=True)]
        if resume is None:
            engines = {name: self._engine(name) for name in spec.drafters}
            manifest, records, todo = {**self._manifest(engines), **({"truncated": cut} if cut else {})}, [], None
            writer = stack.enter_context(RunWriter(self.out, manifest))
        else:
            manifest, records = resume
            by_prompt = {(p.dataset, p.prompt_id): q for q, p in zip(requests, self.prompts, strict=True)}
            todo = {(d, k): [] for d in spec.drafters for k in range(spec.repeats)}
            for m in missing_keys(spec, self.prompts, records):  # in prompt order
                todo[(m["drafter"], m["repeat"])].append(by_prompt[(m["dataset"], m["prompt_id"])])
            engines = {d: self._engine(d) for d in spec.drafters if any(todo[(d, k)] for k in range(spec.repeats))}
            env = environment()  # the resuming checkout and machine, which need not be the first ones
            entry = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kept": len(records),
                     "requests": sum(len(v) for v in todo.values()), "git": env["git"], "machine": env["machine"]}
            manifest = {**manifest, "resumed": [*manifest.get("resumed", []), entry]}
            writer = stack.enter_context(RunWriter(self.out, manifest, append=True))
        if spec.warmup and engines:
            self._warmup(engines, requests)
        return _Open(self, engines, requests, manifest, writer, list(records), todo)

    def _engine(self, name: str) -> RoundLoop:
        spec = self.spec
        drafter = drafter_registry.create(name, self.target, spec.drafter_options.get(name))
        opts = scheduler_options(spec, drafter)
        self.resolved_scheduler_options[name] = {k: str(v) for k, v in opts.items()}
        config = EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, self.batch_cap, spec.top_p,
                              spec.top_k, spec.min_p)
        scheduler = with_profile(create_scheduler(spec.scheduler, **opts), self.target, self._measured)
        return RoundLoop(self.target, drafter, config, scheduler)

    def _warmup(self, engines: dict[str, RoundLoop], requests: Sequence[Request]) -> None:
        """One short untimed generation per drafter (allocator, kernels, caches), not recorded. It decodes with a
        copy of the run's scheduler (:meth:`~dspark_bench.scheduling.schedulers.Scheduler.warmup_copy`): an adapting
        scheduler learns prices and acceptance from every round it sees, and the warmup's are cold and unrecorded
        (before 264a11f, 2026-12-04, they taught the run's scheduler: it took the vanilla step that measures a
        vanilla step's price at R = 1 in the warmup, and the warmup's rows of confidences entered its
        expectations)."""
        probe = [dataclasses.replace(requests[0], request_id=-1, arrival_s=None)]  # closed loop: no clock
        for engine in engines.values():
            short = dataclasses.replace(engine.config, max_new_tokens=min(8, engine.config.max_new_tokens))
            warm = engine.scheduler.warmup_copy()
            RoundLoop(engine.target, engine.drafter, short, warm).run(probe, lambda res: None)
            engine.scheduler.keep_warmup(warm)

    def _manifest(self, engines: dict[str, RoundLoop]) -> dict:
        t = self.target
        return {
            "schema_version": SCHEMA_VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "args": dataclasses.asdict(self.spec),
            "target": {"name": t.name, "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                       "vocab_size": t.vocab_size, "num_layers": t.num_layers, "hidden_size": t.hidden_size,
                       "forward_path": t.forward_path, "linear_kernel": t.linear_kernel,
                       "attention_kernel": t.attention_kernel},
            "drafters": {n: {"config": _plain(e.drafter.config), **_architecture(e.drafter),
                             "scheduler_options": self.resolved_scheduler_options.get(n, {})}
                         for n, e in engines.items()},
            "prompts": [{"dataset": p.dataset, "domain": p.domain, "prompt_id": p.prompt_id, "index": p.index}
                        for p in self.prompts],
            "seeds": {"base": self.spec.seed, "per_request": "base + index within dataset"},
            "engine": {"name": "dspark", "arrivals": load_facts(self.spec)},
            **environment(),
        }


def _architecture(drafter) -> dict:
    """The architecture the drafter actually runs (a loaded checkpoint's, which the options' defaults may not
    show: a 2-layer checkpoint under ``num_layers = 1``), for drafters that carry one."""
    arch = getattr(getattr(drafter, "model", None), "arch", None)
    if hasattr(arch, "to_dict"):  # block drafters: an Arch
        return {"architecture": arch.to_dict()}
    return {"architecture": arch()} if callable(arch) else {}  # chain drafters (Eagle3, MTP): arch() -> dict


def calibration_for(drafter) -> str | None:
    """The drafter's ``calibration.json``: its config's ``calibration`` field, else one next to its checkpoint."""
    named = getattr(drafter.config, "calibration", None)
    if named:
        return str(named)
    ckpt = getattr(drafter.config, "checkpoint", None)
    target = getattr(drafter, "target", None)
    folder = Path(ckpt) if ckpt else (checkpoint.SHIPPED_ROOT / target.name / drafter.name if target else None)
    if folder is not None and (folder / "calibration.json").is_file():
        return str(folder / "calibration.json")
    return None


def resolve_scheduler_options(scheduler: str, options: dict, profile: str | None, drafter) -> dict:
    """``options`` plus ``profile`` and the drafter's calibration where the scheduler takes them and ``options``
    did not set them (shared by runs, sweeps and the lm-eval model)."""
    cls, opts = scheduler_class(scheduler), dict(options)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if "profile" in fields and profile and "profile" not in opts:
        opts["profile"] = profile
    if getattr(cls, "reads_confidence", False) and "calibration" not in opts:
        found = calibration_for(drafter)
        if found:
            opts["calibration"] = found
    return opts


def scheduler_options(spec: RunSpec, drafter) -> dict:
    """The scheduler's options for a run: the spec's own, plus its profile and the drafter's calibration."""
    return resolve_scheduler_options(spec.scheduler, spec.scheduler_options, spec.profile, drafter)


def _plain(config) -> dict:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}

"""Our engine behind the engine interface: the one round loop (:mod:`.loop`) driven by a run (:mod:`.runner`),
in this process or sharded across Ray workers (:mod:`.ray`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from dspark_bench import drafters
from dspark_bench.core.records import RequestRecord
from dspark_bench.drafters import registry
from dspark_bench.engines.base import (
    Engine,
    EngineError,
    RunSpec,
    context_of,
    fit_prompts,
    refuse_server_options,
    register_engine,
    render,
)
from dspark_bench.engines.native.loop import EngineConfig
from dspark_bench.engines.native.runner import Run, check_open_loop, default_drafters
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.scheduling.schedulers import create_scheduler, scheduler_class
from dspark_bench.target.model import EMBEDDED, Target, resolve_target


@register_engine
class NativeEngine(Engine):
    name = "dspark"
    resumable = True

    def default_drafters(self, target: str) -> tuple[str, ...]:
        return default_drafters(target)

    def prepare(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path, say: Callable[[str], None]) -> RunSpec:
        if self.options.options:
            raise EngineError("--engine-opt configures vLLM: give it with --engine vllm")
        refuse_server_options(self.name, self.options)
        check_open_loop(spec)
        if spec.request_rate is not None and (self.options.workers > 1 or self.options.ray_address):
            raise EngineError("--request-rate runs in one process: every drafter meets one arrival schedule; drop "
                              "--workers / --ray-address")
        for name in spec.drafters:
            drafters.drafter_class(name)  # fail on an unknown name before loading anything heavy
        check_drafter_options(spec.drafters, spec.drafter_options)
        check_scheduler(spec.scheduler, spec.scheduler_options, spec.profile)
        EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, spec.concurrency, spec.top_p, spec.top_k,
                     spec.min_p)  # validates early
        check_target(spec.target, self.options.cache_dir)
        check_context(spec, prompts, self.options.cache_dir)
        return spec

    def run(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path,
            on_record: Callable[[RequestRecord], None], say: Callable[[str], None]) -> dict:
        opts = self.options
        if opts.workers > 1 or opts.ray_address:
            from dspark_bench.engines.native.ray import run_on_ray  # Ray is an optional dependency

            say(f"decoding on {opts.workers} Ray workers ...")
            return run_on_ray(spec, prompts, folder, opts.workers, opts.ray_address, opts.cache_dir)
        say(f"loading target [bold]{spec.target}[/] ({spec.dtype}) ...")
        target = Target.load(spec.target, dtype=spec.dtype, cache_dir=opts.cache_dir, forward_path=spec.target_path)
        return Run(spec, target, prompts, folder, on_record=on_record).execute()


def check_drafter_options(names: tuple[str, ...], options: dict[str, dict[str, str]]) -> None:
    """Every ``--drafter-opt`` names a drafter of the run and an option (and value) that drafter takes."""
    stray = [name for name in options if name not in names]
    if stray:
        raise ValueError(f"--drafter-opt names drafter {', '.join(map(repr, stray))}, which this run does not "
                         f"decode; --drafter runs {', '.join(names)} (options are DRAFTER.KEY=VALUE for one of them)")
    for name, opts in options.items():
        registry.make_config(name, opts)  # unknown keys and values of the wrong type fail here


def check_scheduler(name: str, options: dict[str, str], profile: str | None) -> None:
    """Build the scheduler once with the given options (its profile too), so a bad option or value fails now."""
    cls, opts = scheduler_class(name), dict(options)
    if profile and "profile" in {f.name for f in dataclasses.fields(cls)}:
        opts.setdefault("profile", profile)
    create_scheduler(name, **opts)  # unknown keys, values of the wrong type or range, a missing profile file


def check_context(spec: RunSpec, prompts: Sequence[Prompt], cache_dir: Path | None) -> None:
    """Every prompt, rendered with the target's chat template, plus ``max_new_tokens`` fits the target's context,
    or ``spec.truncate`` says how to cut it (:func:`~dspark_bench.engines.base.fit_prompts`): checked from the
    target's tokenizer and config, before its weights load. The run cuts them again from its own rendering."""
    from transformers import AutoConfig, AutoTokenizer

    where = resolve_target(spec.target, cache_dir)
    tokenizer, config = AutoTokenizer.from_pretrained(where), AutoConfig.from_pretrained(where)
    fit_prompts(prompts, [render(tokenizer, p.text) for p in prompts], spec, context_of(config))


def check_target(name: str, cache_dir: Path | None) -> None:
    """A target other than the embedded one must be a model folder or a hub id whose config can be read (from the
    local hub cache, else from the hub), before anything is loaded."""
    if name == EMBEDDED:
        return
    where = resolve_target(name, cache_dir)  # refuses names that are neither a folder nor 'org/name'
    if Path(where).exists():
        if not (Path(where) / "config.json").is_file():
            raise ValueError(f"--target {name}: the folder has no config.json; give a Hugging Face model folder, "
                             f"a hub id 'org/name', or '{EMBEDDED}'")
        return
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(where, "config.json"), str):
        return
    try:
        HfApi().model_info(where, timeout=20)
    except RepositoryNotFoundError:
        raise ValueError(f"--target {name}: no such model on the Hugging Face hub (or it is private); give a local "
                         f"model folder, a hub id 'org/name', or '{EMBEDDED}'") from None
    except Exception as exc:  # no network, a proxy error, a gated repo: say which and stop before loading
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--target {name}: not in the local hub cache and the hub cannot be reached ({first}); "
                         f"give a local model folder, a cached hub id, or '{EMBEDDED}'") from None

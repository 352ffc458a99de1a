"""One interface for every engine: the run specification, what an engine states about itself, and the registry.

An engine is opened with :class:`EngineOptions` (what the command line gave for engines in general, and the
engine's own ``KEY=VALUE`` options), checks and completes a :class:`RunSpec` before any model loads
(:meth:`Engine.prepare`), then decodes the prompts into a run folder (:meth:`Engine.run`): ``manifest.json``,
``records.jsonl`` with one :class:`~dspark_bench.core.records.RequestRecord` per request, as each finishes, and
``summary.json``. Suites, metrics, reports and gates read that folder and never ask which engine wrote it.

**Context.** A prompt, rendered with the target's chat template by the engine (only it knows its tokenizer and
its limit), plus ``max_new_tokens`` must fit the positions the target can take: the target's
``max_position_embeddings``, or the engine's own limit (vLLM's ``max_model_len``). One that does not is refused
before any decoding (:func:`fit_prompts`), or cut from the side ``RunSpec.truncate`` names; the manifest lists
every cut prompt with its original length (``truncated``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from dspark_bench.core.arrivals import Arrivals
from dspark_bench.core.records import RequestRecord
from dspark_bench.core.verify import Sampling
from dspark_bench.evaluation.suites import Prompt


class EngineError(ValueError):
    """A run an engine cannot do, said before any model loads."""


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run (recorded verbatim in the manifest)."""

    target: str = "smollm2-135m"
    drafters: tuple[str, ...] = ("none", "ngram")
    drafter_options: dict[str, dict[str, str]] = field(default_factory=dict)
    scheduler: str = "fixed"
    scheduler_options: dict[str, str] = field(default_factory=dict)
    profile: str | None = None  # engine profile (SPS table) for schedulers that take one
    suite: str = "all"
    limit: int | None = 3
    skip: int = 0  # the prompts that ``limit = skip`` selects were left out (suites.load_suite)
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0  # sampling filters (core.verify.Sampling), applied to the target's p and the draft's q alike
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    block_size: int = 7
    seed: int = 980406
    dtype: str = "bf16"
    target_path: str = "auto"  # the target's decoder forward: fast, hf, or auto (target.model.resolve_forward_path)
    repeats: int = 1
    concurrency: int = 1
    warmup: bool = True
    truncate: str | None = None  # a prompt too long for the context: None refuses it, "left"/"right" cuts that side
    # Load: None keeps --concurrency requests in flight (closed loop); a rate in requests/s (inf: all at once) sends
    # them on a seeded arrival schedule (core.arrivals, seed = the run's seed), at most max_concurrency in flight.
    request_rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    slo: dict[str, float] = field(default_factory=dict)  # ms bounds on ttft / tpot / e2el: the summary's goodput

    @property
    def sampling(self) -> Sampling:
        """The temperature and filters every engine samples with (validated here: bad values raise ValueError)."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.min_p)


@dataclass(frozen=True)
class EngineOptions:
    """How the command line opens an engine. ``options``: the engine's own ``--engine-opt KEY=VALUE`` items;
    ``workers`` / ``ray_address``: sharding across Ray workers, for the engines that support it."""

    cache_dir: Path | None = None
    options: tuple[str, ...] = ()
    workers: int = 1
    ray_address: str | None = None
    base_url: str | None = None  # an OpenAI-compatible server (engine "openai"), e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # the served model name (default: the server's only or first model)
    api_key_env: str | None = None  # the environment variable holding the server's API key (never written down)
    server_label: str | None = None  # what the run calls the server's configuration (its "drafter")
    request_timeout_s: float = 600.0


class Engine(ABC):
    """A decoding engine behind the harness: ours (``dspark``) or another (``vllm``)."""

    name: ClassVar[str]
    resumable: ClassVar[bool] = False  # can complete a run folder a crash left short (``run --resume``)

    def __init__(self, options: EngineOptions):
        self.options = options

    @abstractmethod
    def default_drafters(self, target: str) -> tuple[str, ...]:
        """The drafters a run decodes when none are named."""

    @abstractmethod
    def prepare(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path, say: Callable[[str], None]) -> RunSpec:
        """``spec`` checked against what this engine can do (unknown drafters, options, schedulers, and prompts
        too long for the target's context fail here with :class:`EngineError` or ``ValueError``), completed where
        the engine needs more (e.g. exported drafters). Loads no model (a tokenizer and a config at most)."""

    @abstractmethod
    def run(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path,
            on_record: Callable[[RequestRecord], None], say: Callable[[str], None]) -> dict:
        """Decode ``prompts`` with every drafter of ``spec`` into ``folder``; returns the summary."""


def refuse_server_options(engine: str, options: EngineOptions) -> None:
    """The options of the server engine, refused by an engine that is not one."""
    given = [flag for flag, value in (("--base-url", options.base_url), ("--model", options.model),
                                      ("--api-key-env", options.api_key_env), ("--server-label", options.server_label))
             if value is not None]
    if given:
        raise EngineError(f"{', '.join(given)} configure(s) the server engine: give it with --engine openai, not "
                          f"--engine {engine}")


def arrival_schedule(spec: RunSpec) -> Arrivals | None:
    """The seeded arrival schedule of an open-loop run (seed = the run's seed; request i of the prompt list arrives
    at ``times(n)[i]``), the same for every engine; None for closed-loop load."""
    return None if spec.request_rate is None else Arrivals(spec.request_rate, spec.burstiness, spec.seed)


def load_facts(spec: RunSpec) -> dict:
    """What a manifest records of the load (``engine.arrivals``): the schedule, or the closed loop's concurrency."""
    arrivals = arrival_schedule(spec)
    return arrivals.to_json() if arrivals else {"closed_loop": spec.concurrency}


ENGINES: dict[str, type[Engine]] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; engines: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]


# ---- prompts and the target's context ------------------------------------------------------------------------
TRUNCATE_SIDES = ("left", "right")


def render(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn with the generation prompt, no system prompt (what
    ``Target.render`` does, from the tokenizer alone: no model needs to be loaded to check a prompt's length)."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False, enable_thinking=False)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def context_of(config) -> int | None:
    """The positions a Hugging Face model config says its model takes (``max_position_embeddings``, of its text
    model for a multimodal one); None when it does not say."""
    for source in (config, getattr(config, "text_config", None)):
        value = getattr(source, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_prompts(prompts: Sequence[Prompt], ids: Sequence[Sequence[int]], spec: RunSpec, context: int | None,
                limit: str = "the target's context (max_position_embeddings)"
                ) -> tuple[list[tuple[int, ...]], list[dict]]:
    """Each prompt's token ids fitted to ``context`` positions with room for ``spec.max_new_tokens``: a longer
    prompt is refused (:class:`EngineError` naming the first one, its length and the limit, called ``limit``) or,
    with ``spec.truncate``, cut to ``context - max_new_tokens`` tokens from that side (``left`` keeps its end,
    where the generation prompt is). Returns the ids and, for the manifest, each cut prompt with its original
    length. ``context`` None (not known): nothing is checked."""
    if spec.truncate not in (None, *TRUNCATE_SIDES):
        raise EngineError(f"truncate {spec.truncate!r}: give one of {', '.join(TRUNCATE_SIDES)} (or none)")
    if context is None:
        return [tuple(x) for x in ids], []
    room = context - spec.max_new_tokens
    over = [(p, len(x)) for p, x in zip(prompts, ids, strict=True) if len(x) > room]
    if over and (spec.truncate is None or room < 1):
        p, n = over[0]
        more = f" ({len(over) - 1} more prompts are too long)" if len(over) > 1 else ""
        if room < 1:
            fix = "--max-new-tokens leaves no room for a prompt: give a smaller one"
        else:
            smaller = f", or --max-new-tokens {context - n} or less" if n < context else ""
            fix = f"give --truncate left|right to cut such prompts{smaller}"
        raise EngineError(f"prompt {p.prompt_id} ({p.dataset}) has {n} tokens: with --max-new-tokens "
                          f"{spec.max_new_tokens} it needs {n + spec.max_new_tokens} positions, beyond {limit} of "
                          f"{context}{more}; {fix}")
    if not over:
        return [tuple(x) for x in ids], []
    fitted = [tuple(x) if len(x) <= room else tuple(x[-room:] if spec.truncate == "left" else x[:room])
              for x in ids]
    cut = [{"dataset": p.dataset, "prompt_id": p.prompt_id, "prompt_tokens": n, "kept_tokens": room}
           for p, n in over]
    return fitted, cut

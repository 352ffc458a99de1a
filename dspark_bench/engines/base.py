"""One interface for every engine: the run specification, what an engine states about itself, and the registry.

An engine is opened with :class:`EngineOptions` (what the command line gave for engines in general, and the
engine's own ``KEY=VALUE`` options), checks and completes a :class:`RunSpec` before any model loads
(:meth:`Engine.prepare`), then decodes the prompts into a run folder (:meth:`Engine.run`): ``manifest.json``,
``records.jsonl`` with one :class:`~dspark_bench.core.records.RequestRecord` per request, as each finishes, and
``summary.json``. Suites, metrics, reports and gates read that folder and never ask which engine wrote it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from dspark_bench.core.records import RequestRecord
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
    block_size: int = 7
    seed: int = 980406
    dtype: str = "bf16"
    repeats: int = 1
    concurrency: int = 1
    warmup: bool = True


@dataclass(frozen=True)
class EngineOptions:
    """How the command line opens an engine. ``options``: the engine's own ``--engine-opt KEY=VALUE`` items;
    ``workers`` / ``ray_address``: sharding across Ray workers, for the engines that support it."""

    cache_dir: Path | None = None
    options: tuple[str, ...] = ()
    workers: int = 1
    ray_address: str | None = None


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
    def prepare(self, spec: RunSpec, folder: Path, say: Callable[[str], None]) -> RunSpec:
        """``spec`` checked against what this engine can do (unknown drafters, options, schedulers fail here with
        :class:`EngineError` or ``ValueError``), completed where the engine needs more (e.g. exported drafters)."""

    @abstractmethod
    def run(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path,
            on_record: Callable[[RequestRecord], None], say: Callable[[str], None]) -> dict:
        """Decode ``prompts`` with every drafter of ``spec`` into ``folder``; returns the summary."""


ENGINES: dict[str, type[Engine]] = {}


def register_engine(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.name] = cls
    return cls


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; engines: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]

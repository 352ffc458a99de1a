"""vLLM's offline ``LLM`` API behind the engine interface (``run --engine vllm``): the same suites, seeds, records
and summary, decoded by vLLM (:mod:`.run`), with our shipped Eagle3 exported to vLLM's layout when asked for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dspark_bench.core.records import RequestRecord
from dspark_bench.engines.base import Engine, RunSpec, refuse_server_options, register_engine
from dspark_bench.engines.native.loop import EngineConfig
from dspark_bench.engines.vllm.export import with_shipped_exports
from dspark_bench.engines.vllm.llm import (
    METHODS,
    VllmError,
    parse_engine_options,
    require_vllm,
    split_options,
)
from dspark_bench.engines.vllm.run import VllmRun, check_spec, fitted_requests
from dspark_bench.evaluation.suites import Prompt
from dspark_bench.target.model import resolve_target

DEFAULT_DRAFTERS = ("none", "ngram")


@register_engine
class VllmEngine(Engine):
    name = "vllm"

    def default_drafters(self, target: str) -> tuple[str, ...]:
        return DEFAULT_DRAFTERS

    def prepare(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path, say: Callable[[str], None]) -> RunSpec:
        if self.options.workers > 1 or self.options.ray_address:
            raise VllmError("--workers shards our engine; vLLM scales with --engine-opt data_parallel_size=N (or "
                            "tensor_parallel_size=N)")
        refuse_server_options(self.name, self.options)
        if spec.request_rate is not None:
            raise VllmError("--request-rate: vLLM's offline API takes a run's requests at once; for arrivals over time "
                            "start vLLM's OpenAI server and run --engine openai --base-url http://127.0.0.1:PORT/v1")
        unknown = [n for n in spec.drafters if n not in METHODS]
        if unknown:
            raise VllmError(f"--engine vllm has no method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
        check_spec(spec)
        options = parse_engine_options(self.options.options)  # bad --engine-opt items fail before vLLM starts
        EngineConfig(spec.max_new_tokens, spec.temperature, spec.block_size, spec.concurrency, spec.top_p, spec.top_k,
                     spec.min_p)  # validates early
        if spec.min_p > 0 and any(n != "none" for n in spec.drafters):  # vllm/v1/spec_decode/utils.py
            say("[yellow]warning:[/] vLLM decodes a request with min_p > 0 without speculation "
                "(is_spec_decode_unsupported): its drafters' rounds will propose nothing")
        require_vllm()
        split_options(options)  # names and value types against the installed vLLM, before anything is written
        model = resolve_target(spec.target, self.options.cache_dir)
        fitted_requests(spec, prompts, options, model)  # a prompt beyond the context is refused before vLLM starts
        return with_shipped_exports(spec, folder, self.options.cache_dir, say)

    def run(self, spec: RunSpec, prompts: Sequence[Prompt], folder: Path,
            on_record: Callable[[RequestRecord], None], say: Callable[[str], None]) -> dict:
        run = VllmRun(spec, prompts, folder, parse_engine_options(self.options.options), self.options.cache_dir,
                      on_record=on_record, on_status=say)
        return run.execute()

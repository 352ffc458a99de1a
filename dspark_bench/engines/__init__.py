"""Engines behind one interface (:mod:`.base`): our native loop (:mod:`.native`) and vLLM's offline API
(:mod:`.vllm`). Importing this package registers both."""

from dspark_bench.engines.base import ENGINES, Engine, EngineError, EngineOptions, RunSpec, engine_class
from dspark_bench.engines.native.engine import NativeEngine
from dspark_bench.engines.vllm.engine import VllmEngine

__all__ = ["ENGINES", "Engine", "EngineError", "EngineOptions", "NativeEngine", "RunSpec", "VllmEngine",
           "engine_class"]

"""Engines behind one interface (:mod:`.base`): our native loop (:mod:`.native`), vLLM's offline API
(:mod:`.vllm`) and any OpenAI-compatible server (:mod:`.http`). Importing this package registers all three."""

from dspark_bench.engines.base import ENGINES, Engine, EngineError, EngineOptions, RunSpec, engine_class
from dspark_bench.engines.http.engine import OpenAIEngine
from dspark_bench.engines.native.engine import NativeEngine
from dspark_bench.engines.vllm.engine import VllmEngine

__all__ = ["ENGINES", "Engine", "EngineError", "EngineOptions", "NativeEngine", "OpenAIEngine", "RunSpec",
           "VllmEngine", "engine_class"]

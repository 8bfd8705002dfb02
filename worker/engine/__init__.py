"""Inference engines behind one interface: vLLM (the fast path), transformers (machines without vLLM),
and, for tests only, the scripted engine (chosen by the worker's environment, never by a spec)."""

from __future__ import annotations

import os

from orchestrator.core.errors import EngineLoadError
from orchestrator.core.spec import ModelSpec, WorkersSpec
from worker.engine.base import Engine
from worker.engine.scripted import TEST_ENGINE_ENV

__all__ = ["Engine", "load_engine"]


def load_engine(model: ModelSpec, workers: WorkersSpec | None = None) -> Engine:
    max_in_flight = workers.max_in_flight if workers else None
    test_engine = os.environ.get(TEST_ENGINE_ENV, "")
    if test_engine:
        if test_engine != "scripted":
            raise EngineLoadError(f"{TEST_ENGINE_ENV}={test_engine!r}: the one test engine is 'scripted'")
        from worker.engine.scripted import ScriptedEngine

        return ScriptedEngine(model, max_in_flight=max_in_flight)
    if model.engine == "transformers":
        from worker.engine.hf_engine import TransformersEngine

        return TransformersEngine(model, max_in_flight=max_in_flight)
    if model.runner == "pooling":
        from worker.engine.embedding_engine import VllmEmbeddingEngine

        return VllmEmbeddingEngine(model, max_in_flight=max_in_flight)
    from worker.engine.vllm_engine import VllmEngine

    return VllmEngine(model, max_in_flight=max_in_flight)

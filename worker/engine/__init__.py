"""Inference engines behind one interface: vLLM (the fast path) and transformers (machines without vLLM)."""

from __future__ import annotations

from orchestrator.core.spec import ModelSpec, WorkersSpec
from worker.engine.base import Engine

__all__ = ["Engine", "load_engine"]


def load_engine(model: ModelSpec, workers: WorkersSpec | None = None) -> Engine:
    max_in_flight = workers.max_in_flight if workers else None
    if model.engine == "transformers":
        from worker.engine.hf_engine import TransformersEngine

        return TransformersEngine(model, max_in_flight=max_in_flight)
    if model.runner == "pooling":
        from worker.engine.embedding_engine import VllmEmbeddingEngine

        return VllmEmbeddingEngine(model, max_in_flight=max_in_flight)
    from worker.engine.vllm_engine import VllmEngine

    return VllmEngine(model, max_in_flight=max_in_flight)

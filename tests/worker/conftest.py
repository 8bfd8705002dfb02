"""Worker fixtures: the test models (built once, cached in .cache/models) and one engine per session.

Every test here is of the real-engine tier: vLLM (or transformers) itself is what they test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.models import COMPACT_JSON, MODELS

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of this folder is of the real-engine tier (a hook sees every item of the session)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.real_engine)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from model_builders import build_tiny

    return str(build_tiny(MODELS / "tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_model() -> str:
    from model_builders import build_smollm2

    return str(build_smollm2(MODELS / "smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def keep_alive():
    """Hold an engine a test opens beside the session's until the session ends. Collecting a vLLM
    engine tears down vLLM's process-wide parallel state ("pipeline model parallel group is not
    initialized"), which breaks every engine the session still uses."""
    kept: list[object] = []
    yield kept.append
    kept.clear()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model):
    from orchestrator.core.spec import ModelSpec
    from worker.engine.vllm_engine import VllmEngine

    # Compact JSON under a JSON constraint (vLLM sets this per engine, not per request): random
    # weights would otherwise pad structured output with whitespace up to max_tokens.
    engine = VllmEngine(ModelSpec(name=tiny_model, engine_args=COMPACT_JSON))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_embed_model() -> str:
    from model_builders import build_tiny_embed

    return str(build_tiny_embed(MODELS / "tiny-embed"))


@pytest.fixture(scope="session")
def tiny_reranker_model() -> str:
    from model_builders import build_tiny_reranker

    return str(build_tiny_reranker(MODELS / "tiny-reranker"))


@pytest.fixture(scope="session")
def embed_engine(tiny_embed_model):
    """The tiny Llama on vLLM's pooling runner (last-token pooling, Matryoshka 32/64/128)."""
    from orchestrator.core.spec import ModelSpec
    from worker.engine import load_engine

    engine = load_engine(ModelSpec(name=tiny_embed_model, runner="pooling"))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_lora_adapter() -> str:
    """A LoRA adapter (peft) on the tiny Llama that answers every chat with "Bonjour!"."""
    from model_builders import build_tiny_lora

    return str(build_tiny_lora(MODELS / "tiny-lora"))


@pytest.fixture(scope="session")
def tiny_vlm_model() -> str:
    from model_builders import build_tiny_vlm

    return str(build_tiny_vlm(MODELS / "tiny-vlm"))


@pytest.fixture(scope="session")
def vlm_engine(tiny_vlm_model):
    """A tiny random-weight Idefics3 (SigLIP on the tiny Llama) on vLLM."""
    from orchestrator.core.spec import ModelSpec
    from worker.engine.vllm_engine import VllmEngine

    engine = VllmEngine(ModelSpec(name=tiny_vlm_model))
    yield engine
    engine.close()

"""The test models (`make models` builds them into .cache/models) and the engine the workers a test starts run.

Workers a test starts run the scripted engine (worker/engine/scripted.py: answers from the request,
no model) unless the test is marked `real_engine`: tests/conftest.py sets the environment below for
each test, and a fixture that starts a server for a whole module passes it explicitly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.engine.scripted import LOAD_ENV, STEP_ENV, TEST_ENGINE_ENV

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / ".cache" / "models"
#: A tiny random-weight Llama: the model of most tests (it answers at once, never stops before max_tokens).
TINY = MODELS / "tiny-llama"
#: The tiny Llama on vLLM's pooling runner: embeddings, score and rerank.
TINY_EMBED = MODELS / "tiny-embed"
#: The tiny Llama with <think> tokens: the reasoning tests, and a second model where a test needs two.
TINY_THINK = MODELS / "tiny-think"
#: SmolLM2-135M-Instruct: real answers (the demo's model).
SMOLLM2 = MODELS / "smollm2-135m-instruct"
#: Compact JSON under a JSON constraint (vLLM sets this per engine, not per request): random weights
#: would otherwise pad structured output with whitespace up to max_tokens.
COMPACT_JSON = {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}

#: The environment of workers on the spec's own engine (vLLM): the real-engine tier.
REAL_ENGINE = {TEST_ENGINE_ENV: "", STEP_ENV: "", LOAD_ENV: ""}


def scripted_engine(step_s: float = 0.0, load_s: float = 0.0) -> dict[str, str]:
    """The environment of workers on the scripted engine, each engine step (a word of every row in
    flight) taking `step_s` seconds and its load `load_s`: a pace for a test that must catch a chunk
    half done, or a worker loading."""
    return {TEST_ENGINE_ENV: "scripted", STEP_ENV: f"{step_s:g}", LOAD_ENV: f"{load_s:g}"}


def built(model: Path) -> str:
    """The model's path, once `make models` has built it; the test fails saying so otherwise."""
    if not (model / ".built").exists():
        pytest.fail(f"{model.name} is missing: run `make models` (make test does it)")
    return str(model)

"""The README's request-field table, driven: every field fed to both real engines, each answer what the table says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec
from tests.worker.test_structured import answer

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
URLS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

#: One valid use of each field, per endpoint when they differ (the fields it needs come with it).
SAMPLES = {
    "messages": {},
    "prompt": {},
    "max_tokens": {"max_tokens": 3},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "temperature": {"temperature": 0.5, "seed": 1},
    "top_p": {"top_p": 0.9},
    "n": {"n": 2, "temperature": 1.0},
    "stop": {"stop": ["."]},
    "seed": {"seed": 3},
    "logprobs": {"chat": {"logprobs": True}, "completions": {"logprobs": 2}},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "echo": {"echo": True},
    "best_of": {"best_of": 1},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "logit_bias": {"logit_bias": {"5": 3}},
    "response_format": {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
    "tools": {"tools": [WEATHER_TOOL]},
    "tool_choice": {"tools": [WEATHER_TOOL], "tool_choice": "none"},
    "parallel_tool_calls": {"parallel_tool_calls": False},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "min_tokens": {"min_tokens": 2},
    "ignore_eos": {"ignore_eos": True},
    "structured_outputs": {"structured_outputs": {"choice": ["a", "b"]}},
    "model": {"model": "gpt-4o-mini"},
    "user": {"user": "u-1"},
    "metadata": {"metadata": {"k": "v"}},
    "store": {"store": False},
    "stream": {"stream": False},
    "stream_options": {"stream_options": {"include_usage": True}},
    "service_tier": {"service_tier": "auto"},
    "prompt_cache_key": {"prompt_cache_key": "k"},
    "safety_identifier": {"safety_identifier": "s"},
    "audio": {"audio": {"voice": "alloy", "format": "wav"}},
    "modalities": {"modalities": ["text", "audio"]},
    "functions": {"functions": [WEATHER_TOOL["function"]]},
    "function_call": {"function_call": "auto"},
    "prediction": {"prediction": {"type": "content", "content": "x"}},
    "reasoning_effort": {"reasoning_effort": "low"},
    "verbosity": {"verbosity": "low"},
    "web_search_options": {"web_search_options": {}},
    "suffix": {"suffix": "!"},
}


def table() -> list[tuple[str, list[str], str, str]]:
    """(field, endpoints, vLLM, transformers) for each row of the README's field table."""
    rows = []
    for line in README.read_text().splitlines():
        m = re.fullmatch(r"\| `(\w+)` \| ([\w, ]+) \| ([\w ]+) \| ([\w ]+) \|", line)
        if m:
            rows.append((m[1], [e.strip() for e in m[2].split(",")], m[3], m[4]))
    return rows


def body(field: str, endpoint: str) -> dict:
    sample = SAMPLES[field]
    sample = sample.get(endpoint, sample) if endpoint in sample else sample
    base = {"messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat" else {"prompt": "hi"}
    return {**base, "max_tokens": 3, **sample}


@pytest.fixture(scope="module")
def engines(tiny_engine, tiny_model):
    from worker.engine.hf_engine import TransformersEngine
    from worker.engine.vllm_engine import VllmEngine

    vllm = VllmEngine(
        ModelSpec(name=tiny_model, tool_parser="hermes", chat_template=TOOLS_CHAT_TEMPLATE), llm=tiny_engine.llm
    )
    hf = TransformersEngine(ModelSpec(name=tiny_model, engine="transformers", chat_template=TOOLS_CHAT_TEMPLATE))
    return {"vLLM": vllm, "transformers": hf}


def test_fields_table_covers_every_sample():
    assert {row[0] for row in table()} == set(SAMPLES)


@pytest.mark.parametrize("engine_name", ["vLLM", "transformers"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fields_each_does_what_the_readme_says(engines, engine_name, endpoint):
    rows = [(field, said[engine_name == "transformers"]) for field, eps, *said in table() if endpoint in eps]
    lines = answer(engines[engine_name], *(body(field, endpoint) for field, _ in rows), url=URLS[endpoint])
    wrong = []
    for (field, said), line in zip(rows, lines, strict=True):
        failed = line["error"] is not None
        named = failed and line["response"]["body"]["error"]["param"] in body(field, endpoint)
        if (said == "error row") != failed or (failed and not named):
            wrong.append((field, said, json.dumps(line["error"])))
    assert not wrong, wrong

"""One input file through vLLM's own `run_batch` and through orch's engine: greedy answers match token for token."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec
from tests.worker.conftest import COMPACT_JSON
from tests.worker.test_structured import SCHEMA, answer

pytestmark = pytest.mark.slow

CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}\n</tool_call>'
BODIES = [
    {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0},
    {
        "messages": [{"role": "user", "content": "It broke after a day."}],
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "triage", "schema": SCHEMA}},
    },
    {
        "messages": [{"role": "user", "content": "Spam?"}],
        "max_tokens": 8,
        "temperature": 0,
        "structured_outputs": {"choice": ["spam", "ham"]},
    },
    {
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "max_tokens": 200,
        "temperature": 0,
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "structured_outputs": {"regex": CALL},
    },
    # Embeddings (/v1/embeddings) join here once the pooling runner lands: run_batch serves them too.
]


def comparable(line: dict) -> dict:
    """What must agree: the text, the tool calls (ids are random), the finish reason, the token counts."""
    body = line["response"]["body"]
    choice = body["choices"][0]
    calls = [c["function"] for c in choice["message"].get("tool_calls") or []]
    return {
        "content": choice["message"]["content"] or "",
        "tool_calls": calls,
        "finish_reason": choice["finish_reason"],
        "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")},
    }


def test_run_batch_parity_greedy_answers_match(tiny_engine, tiny_model, tmp_path):
    from worker.engine.vllm_engine import VllmEngine

    requests = tmp_path / "in.jsonl"
    requests.write_text(
        "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}) + "\n"
            for i, b in enumerate(BODIES)
        )
    )
    template = tmp_path / "template.jinja"
    template.write_text(TOOLS_CHAT_TEMPLATE)
    out = tmp_path / "out.jsonl"
    # 1. vLLM's own batch runner, with the settings orch uses on a CPU.
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o", str(out)]
    command += ["--model", tiny_model, "--chat-template", str(template), "--dtype", "float32", "--enforce-eager"]
    command += ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--max-model-len", "1024"]
    command += ["--kv-cache-memory-bytes", str(256 * 2**20), "--no-enable-chunked-prefill", "--seed", "0"]
    command += ["--structured-outputs-config", json.dumps(COMPACT_JSON["structured_outputs_config"])]
    subprocess.run(
        command,
        check=True,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        timeout=500,
    )
    theirs = {(line := json.loads(text))["custom_id"]: line for text in out.read_text().splitlines()}
    # 2. orch's engine, the same template and parser.
    engine = VllmEngine(
        ModelSpec(name=tiny_model, tool_parser="hermes", chat_template=TOOLS_CHAT_TEMPLATE), llm=tiny_engine.llm
    )
    ours = answer(engine, *BODIES)
    for i, line in enumerate(ours):
        assert theirs[f"r{i}"]["error"] is None, theirs[f"r{i}"]
        assert comparable(line) == comparable(theirs[f"r{i}"]), i
    assert comparable(ours[3])["tool_calls"], "the forced call was not parsed"

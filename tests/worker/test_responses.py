"""`/v1/responses` lines and reasoning models, against vLLM's own serving classes on the same lines.

vLLM 0.32's `run_batch` does not take /v1/responses, so the reference is vLLM's
`OpenAIServingResponses` / `OpenAIServingChat` built as `run_batch` builds them
(tests/worker/vllm_serving.py), with the settings orch uses on a CPU. Greedy rows must agree
on the text, the tool calls, the reasoning, the status and the usage; every line orch writes
must validate as the openai SDK's type (`Response`, `ChatCompletion`).

Reasoning: the tiny random model cannot think, so the test model (model_builders.build_tiny_think)
has `<think>` and `</think>` as tokens, and each row forces `<think>words</think>words` with a
regex (vLLM's grammar, held during the thinking too by `enable_in_reasoning`) and a logit_bias
that makes the grammar pick the think tokens rather than spell them. vLLM's `deepseek_r1`
reasoning parser then reads the thinking off, on both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec, SamplingSpec
from tests.support.engines import SCHEMA, answer, prompt_ids
from tests.support.models import COMPACT_JSON, MODELS
from worker.requests import parse_request
from worker.wire import EngineRequest, RowResult

CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}\n</tool_call>'
FLAT_TOOL = {"type": "function", **WEATHER_TOOL["function"]}
RESPONSES = [
    {"input": "Hello", "max_output_tokens": 8, "temperature": 0},
    {
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]}],
        "max_output_tokens": 24,
        "temperature": 0,
        "metadata": {"batch": "x"},
        "store": True,
        "reasoning": {"effort": "low"},
    },
    {
        "input": "It broke after a day.",
        "max_output_tokens": 64,
        "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "triage", "schema": SCHEMA, "strict": True}},
    },
    {
        "input": [
            {"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "And in Rome?"},
        ],
        "tools": [FLAT_TOOL],
        "tool_choice": "auto",
        "max_output_tokens": 200,
        "temperature": 0,
        "structured_outputs": {"regex": CALL},
    },
    {  # two calls in one assistant turn, the second's arguments not JSON (the template gets {})
        "input": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": Rome'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
            {"role": "user", "content": "Which is warmer?"},
        ],
        "tools": [FLAT_TOOL],
        "max_output_tokens": 16,
        "temperature": 0,
    },
]
#: What vLLM's lines add: the prompt's token ids in the answer (orch's are read off its engine).
IDS = {"enable_response_messages": True}
#: Thinking then an answer, with the think tokens themselves (ids of model_builders.THINK_TOKENS).
THINK = {"structured_outputs": {"regex": "<think>[a-z ]{4,20}</think>[a-z ]{4,20}"}, "temperature": 0}
REASONING_CHAT = [{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 80, **THINK}]
REASONING_RESPONSES = [
    {"input": "Hello", "max_output_tokens": 80, **THINK},
    {"input": "Hi", "max_output_tokens": 3, **THINK},
]


def reference(tmp_path: Path, model: str, lines: list[tuple[str, dict]], *flags: str) -> dict[str, dict]:
    """Each line's body as vLLM's serving classes answer it, by custom_id."""
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text(
        "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": {"model": model, **body}}) + "\n"
            for i, (url, body) in enumerate(lines)
        )
    )
    command = [sys.executable, str(Path(__file__).with_name("vllm_serving.py")), "-i", str(requests), "-o", str(out)]
    command += ["--model", model, "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"]
    command += ["--kv-cache-memory-bytes", str(256 * 2**20), "--no-enable-chunked-prefill", "--seed", "0", *flags]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(command, env=env, timeout=500, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return {(line := json.loads(text))["custom_id"]: line["body"] for text in out.read_text().splitlines()}


def response_view(body: dict) -> dict:
    """What a Response must agree on (ids are random)."""
    items = []
    for item in body["output"]:
        if item["type"] == "message":
            items.append(("message", "".join(part["text"] for part in item["content"])))
        elif item["type"] == "reasoning":
            items.append(("reasoning", "".join(part["text"] for part in item["content"] or [])))
        else:
            items.append(("function_call", item["name"], json.loads(item["arguments"])))
    usage = body["usage"]
    return {
        "status": body["status"],
        "incomplete_details": body["incomplete_details"],
        "output": items,
        "usage": (
            usage["input_tokens"],
            usage["output_tokens"],
            usage["total_tokens"],
            usage["output_tokens_details"]["reasoning_tokens"],
        ),
    }


def chat_view(body: dict) -> dict:
    choice = body["choices"][0]
    details = body["usage"].get("completion_tokens_details") or {}
    return {
        "content": choice["message"]["content"],
        "reasoning": choice["message"].get("reasoning"),
        "finish_reason": choice["finish_reason"],
        "usage": (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"], details.get("reasoning_tokens")),
    }


@pytest.mark.slow
def test_responses_lines_match_vllm_serving(tiny_engine, tiny_model, tmp_path):
    from worker.engine.vllm_engine import VllmEngine

    flags = ["--chat-template", str(tmp_path / "template.jinja"), "--tool-call-parser", "hermes"]
    (tmp_path / "template.jinja").write_text(TOOLS_CHAT_TEMPLATE)
    flags += [
        "--enable-auto-tool-choice",
        "--structured-outputs-config",
        json.dumps(COMPACT_JSON["structured_outputs_config"]),
    ]
    theirs = reference(tmp_path, tiny_model, [("/v1/responses", b | IDS) for b in RESPONSES], *flags)
    engine = VllmEngine(
        ModelSpec(name=tiny_model, tool_parser="hermes", chat_template=TOOLS_CHAT_TEMPLATE), llm=tiny_engine.llm
    )
    for i, body in enumerate(RESPONSES):  # the prompts, token for token
        assert prompt_ids(engine, body, "/v1/responses") == theirs[f"r{i}"]["input_messages"][0]["tokens"], i
    ours = [line["response"]["body"] for line in answer(engine, *RESPONSES, url="/v1/responses")]
    for i, body in enumerate(ours):
        assert response_view(body) == response_view(theirs[f"r{i}"]), i
    assert ours[0]["status"] == "incomplete" and ours[0]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert ours[1]["instructions"] == "Be brief." and ours[1]["metadata"] == {"batch": "x"}
    assert json.loads(response_view(ours[2])["output"][0][1])["label"] in SCHEMA["properties"]["label"]["enum"]
    call = response_view(ours[3])["output"][-1]
    assert call[:2] == ("function_call", "get_weather"), call
    assert ours[3]["output"][-1]["call_id"]


@pytest.fixture(scope="module")
def think_model() -> str:
    """`make models` builds it; a lone run of this file builds it when it is missing."""
    from model_builders import build_tiny_think

    path = MODELS / "tiny-think"
    return str(path if (path / ".built").exists() else build_tiny_think(path))


@pytest.mark.slow
def test_reasoning_matches_vllm_serving(think_model, tmp_path, keep_alive):
    from transformers import AutoTokenizer

    from worker.engine.vllm_engine import VllmEngine

    ids = AutoTokenizer.from_pretrained(think_model).convert_tokens_to_ids(["<think>", "</think>"])
    bias = {"logit_bias": {str(i): 100 for i in ids}}
    chats, responses = [{**b, **bias} for b in REASONING_CHAT], [{**b, **bias} for b in REASONING_RESPONSES]
    in_reasoning = '{"enable_in_reasoning": true}'
    lines = [("/v1/chat/completions", b) for b in chats] + [("/v1/responses", b) for b in responses]
    theirs = reference(
        tmp_path, think_model, lines, "--reasoning-parser", "deepseek_r1", "--structured-outputs-config", in_reasoning
    )
    spec = ModelSpec(
        name=think_model,
        reasoning_parser="deepseek_r1",
        engine_args={"structured_outputs_config": {"enable_in_reasoning": True}},
    )
    engine = VllmEngine(spec)
    keep_alive(engine)
    try:
        chat_lines = answer(engine, *chats)
        response_lines = answer(engine, *responses, url="/v1/responses")
    finally:
        engine.close()
    chat = chat_lines[0]["response"]["body"]
    assert chat_view(chat) == chat_view(theirs["r0"])
    assert chat_view(chat)["reasoning"] and chat_view(chat)["usage"][2] > 0, chat
    for i, line in enumerate(response_lines, len(chats)):
        assert response_view(line["response"]["body"]) == response_view(theirs[f"r{i}"]), i
    full = response_view(response_lines[0]["response"]["body"])
    assert [item[0] for item in full["output"]] == ["reasoning", "message"], full
    assert full["usage"][3] > 0, full  # the tokens between <think> and </think>
    cut = response_view(response_lines[1]["response"]["body"])
    assert cut["status"] == "incomplete" and cut["output"][0][0] == "reasoning", cut


def parsed(body: dict) -> EngineRequest | RowResult:
    return parse_request(json.dumps({"custom_id": "x", "url": "/v1/responses", "body": body}), 0, SamplingSpec())


def test_responses_body_becomes_a_chat():
    request = parsed(RESPONSES[3] | {"instructions": "Answer briefly."})
    assert isinstance(request, EngineRequest) and request.kind == "response"
    assert request.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "user", "content": "And in Rome?"},
    ]
    assert request.tools is not None and json.loads(request.tools.tools) == [WEATHER_TOOL]
    assert request.params.max_tokens == 200
    schema = parsed(RESPONSES[2])
    assert isinstance(schema, EngineRequest) and schema.params.constraint is not None
    assert json.loads(schema.params.constraint.value) == SCHEMA


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": "x", "n": 2}, "unsupported_parameter", "n"),
        ({"input": "x", "max_tokens": 5}, "unsupported_parameter", "max_tokens"),
        ({"input": "x", "previous_response_id": "resp_1"}, "invalid_parameter", "previous_response_id"),
        ({"input": "x", "background": True}, "invalid_parameter", "background"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools"),
        ({"input": []}, "invalid_input", "input"),
        ({"input": [{"type": "image_generation_call"}]}, "invalid_input", "input"),
        ({"input": "x", "max_output_tokens": 0}, "invalid_parameter", "max_output_tokens"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "invalid_parameter", "response_format"),
        (
            {"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [FLAT_TOOL]},
            "invalid_parameter",
            "tool_choice",
        ),
    ],
)
def test_responses_body_errors_name_the_field(body, code, param):
    row = parsed(body)
    assert isinstance(row, RowResult) and row.error
    error = row.line.model_dump(mode="json")["response"]["body"]["error"]
    assert (error["code"], error["param"]) == (code, param), error

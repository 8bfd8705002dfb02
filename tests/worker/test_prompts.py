"""One prompt path: both engines build the same prompt tokens for the same request, templates from text or file."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.chat_template import read_chat_template
from orchestrator.core.errors import ChatTemplateError
from orchestrator.core.spec import ModelSpec, SamplingSpec
from worker.prompts import Prompt
from worker.requests import parse_request
from worker.wire import EngineRequest, RowResult

#: Greedy unless a line says otherwise: the tests compare answers (OpenAI's default would sample).
GREEDY = SamplingSpec(temperature=0)

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]}
COMPLETION = {"prompt": "Once upon a time"}
#: A template unlike the model's own, so that using it (or not) shows in the tokens.
FILE_TEMPLATE = "{% for m in messages %}### {{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}### ASSISTANT:"


def request(body: dict, url: str = "/v1/chat/completions", index: int = 0) -> EngineRequest:
    line = json.dumps({"custom_id": f"r{index}", "url": url, "body": {"max_tokens": 4, **body}})
    parsed = parse_request(line, index, GREEDY)
    assert isinstance(parsed, EngineRequest)
    return parsed


def tokens(engine, req: EngineRequest) -> list[int]:
    prompt = engine.prompts.build(req)
    assert isinstance(prompt, Prompt), prompt
    return prompt.token_ids


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("templates") / "chat.jinja"
    path.write_text(FILE_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def engines(tiny_model, tiny_engine, template_file):
    """Both engines on the tiny model, with its own template and with the one from the file."""
    from worker.engine.hf_engine import TransformersEngine
    from worker.engine.vllm_engine import VllmEngine

    own = ModelSpec(name=tiny_model, engine="transformers")
    from_file = ModelSpec(name=tiny_model, engine="transformers", chat_template=template_file)
    return {
        "own": (tiny_engine, TransformersEngine(own)),
        "file": (VllmEngine(from_file, llm=tiny_engine.llm), TransformersEngine(from_file)),
    }


@pytest.mark.parametrize("template", ["own", "file"])
def test_prompts_both_engines_build_the_same_tokens(engines, template):
    vllm, hf = engines[template]
    chat = request(CHAT)
    completion = request(COMPLETION, url="/v1/completions")
    assert tokens(vllm, chat) == tokens(hf, chat)
    assert tokens(vllm, completion) == tokens(hf, completion)
    # What each engine generated from: the prompt tokens its answer reports.
    for engine in (vllm, hf):
        rows = [row for step in engine.run(iter([chat])) for row in step]
        assert rows[0].line.response.body["usage"]["prompt_tokens"] == len(tokens(hf, chat))


def test_prompts_developer_messages_reach_the_template_as_system_in_both_engines(engines):
    developer = request({"messages": [{"role": "developer", "content": "Be brief."}, CHAT["messages"][1]]})
    for engine in engines["own"]:
        assert tokens(engine, developer) == tokens(engine, request(CHAT))


def test_prompts_chat_template_file_is_read_not_taken_as_text(engines):
    _, own = engines["own"]
    _, from_file = engines["file"]
    chat = request(CHAT)
    text = from_file.tokenizer.decode(tokens(from_file, chat))
    assert text == "### SYSTEM: Be brief.\n### USER: What is 2 + 2?\n### ASSISTANT:"
    assert tokens(own, chat) != tokens(from_file, chat)


def test_prompts_context_length_is_the_same_error_row_in_both_engines(engines):
    vllm, hf = engines["own"]
    long = request({"messages": [{"role": "user", "content": "word " * 2000}]})
    rows = [engine.prompts.build(long) for engine in (vllm, hf)]
    assert all(isinstance(r, RowResult) and r.error for r in rows)
    errors = [r.line.error for r in rows]
    assert errors[0].code == errors[1].code == "context_length_exceeded"
    assert errors[0].message == errors[1].message and "1024 tokens" in errors[0].message
    assert rows[0].line.response.body["error"]["param"] == "messages"


def test_prompts_chat_template_neither_file_nor_template_is_refused(tmp_path):
    missing = str(tmp_path / "templates" / "chat.jinja")
    with pytest.raises(ChatTemplateError, match="neither a file on this machine nor a Jinja template"):
        read_chat_template(missing)
    assert read_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"

"""Tools on the real vLLM engine with vLLM's `hermes` tool parser and a Hermes-style chat template.

The tiny model has random weights, so what makes it call a tool differs by tool_choice:
`required` and a named function are enforced by the structural tag vLLM's parser puts on the row
(the call is forced by vLLM's grammar, then parsed by vLLM; a logit_bias against whitespace-only
tokens keeps the random model from padding the arguments forever); for `auto` the call text is
forced with a regex here (vLLM keeps a row's own constraint for a non-strict tool under auto), and
what is tested is that vLLM's parser reads it back.
"""

from __future__ import annotations

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec
from tests.support.engines import answer

pytestmark = pytest.mark.slow

#: `strict: true` (OpenAI's flag) makes vLLM hold the arguments to the schema too; without it only
#: the call's envelope is constrained, and random weights write endless arguments.
TOOL = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "strict": True}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tools_engine(tiny_engine, tiny_model):
    """The session's engine (same weights, same vllm.LLM) with the hermes parser and template."""
    from worker.engine.vllm_engine import VllmEngine

    spec = ModelSpec(name=tiny_model, tool_parser="hermes", chat_template=TOOLS_CHAT_TEMPLATE)
    return VllmEngine(spec, llm=tiny_engine.llm)


def weather(tool_choice=None, tool=TOOL, **params):
    body = {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [tool], **params}
    return body if tool_choice is None else {**body, "tool_choice": tool_choice}


def choice_of(line):
    assert line["error"] is None, line
    return line["response"]["body"]["choices"][0]


def test_tools_named_and_required_force_a_call_of_the_tool(tools_engine):
    # vLLM's structural tag forces the call's envelope and the function's name; random weights
    # then pad the (strict) arguments until max_tokens, so the call is checked as text here and
    # its parsing into tool_calls by the auto test below.
    named, required = answer(tools_engine, weather(NAMED, max_tokens=64), weather("required", max_tokens=64))
    for line in (named, required):
        text = choice_of(line)["message"]["content"]
        assert text.replace("\n", "").startswith('<tool_call>{"name": "get_weather", "arguments": {'), text


def test_tools_auto_call_is_parsed_by_vllms_parser(tools_engine):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    forced, free = answer(
        tools_engine,
        weather(
            "auto",
            WEATHER_TOOL,
            max_tokens=200,
            structured_outputs={"regex": call.replace("{", r"\{").replace("}", r"\}")},
        ),
        weather(max_tokens=8),  # auto by default; the random model writes no call
    )
    (parsed,) = choice_of(forced)["message"]["tool_calls"]
    assert parsed["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert choice_of(forced)["finish_reason"] == "tool_calls"
    assert "tool_calls" not in choice_of(free)["message"] and choice_of(free)["message"]["content"]


def test_tools_none_generates_text_with_the_tools_in_the_prompt(tools_engine):
    plain = {"messages": weather()["messages"], "max_tokens": 8, "ignore_eos": True}
    none, without = answer(tools_engine, weather("none", max_tokens=8, ignore_eos=True), plain)
    assert "tool_calls" not in choice_of(none)["message"]
    assert none["response"]["body"]["usage"]["prompt_tokens"] > without["response"]["body"]["usage"]["prompt_tokens"]


def test_tools_bad_fields_are_error_rows_naming_them(tiny_engine, tools_engine):
    lines = answer(
        tools_engine,
        weather({"type": "function", "function": {"name": "get_time"}}),
        weather("sometimes"),
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    )
    (no_parser,) = answer(tiny_engine, weather("required"))
    params = [line["response"]["body"]["error"]["param"] for line in [*lines, no_parser]]
    assert params == ["tool_choice", "tool_choice", "tool_choice", "tools", "tool_choice"]
    assert "model.tool_parser" in no_parser["error"]["message"]

"""Structured output and logit_bias on the real vLLM engine (the tiny random model): the output
follows the constraint because vLLM's grammar backend forces it, whatever the weights say."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest

from orchestrator.core.spec import SamplingSpec
from tests.support.engines import SCHEMA, answer
from tests.support.openai_lines import check_line
from worker.requests import parse_request
from worker.wire import Constraint, EngineRequest

pytestmark = pytest.mark.slow

PROMPTS = ["Great product!", "It broke after a day.", "Delivery was on time.", "1 2 3"]


def chat(text, **params):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 64, **params}


def content(line):
    return line["response"]["body"]["choices"][0]["message"]["content"]


def test_structured_json_schema_output_conforms(tiny_engine):
    response_format = {"type": "json_schema", "json_schema": {"name": "triage", "schema": SCHEMA, "strict": True}}
    lines = answer(tiny_engine, *(chat(p, response_format=response_format) for p in PROMPTS))
    for line in lines:
        assert line["error"] is None, line
        jsonschema.validate(json.loads(content(line)), SCHEMA)


def test_structured_json_object_is_json(tiny_engine):
    # Random weights write endless strings; a bias towards `"` and `}` lets them end, and only the
    # grammar keeps the biased output a JSON object.
    bias = {str(tiny_engine.tokenizer.encode(c, add_special_tokens=False)[0]): 30 for c in '"}'}
    constrained, free = answer(
        tiny_engine,
        chat("JSON", logit_bias=bias, response_format={"type": "json_object"}),
        chat("JSON", logit_bias=bias, max_tokens=8),
    )
    assert isinstance(json.loads(content(constrained)), dict)
    with pytest.raises(ValueError):
        json.loads(content(free))


def test_structured_text_format_changes_nothing(tiny_engine):
    plain, text = answer(
        tiny_engine, chat("hello", max_tokens=16), chat("hello", max_tokens=16, response_format={"type": "text"})
    )
    assert content(text) == content(plain)


def test_structured_outputs_choice_regex_grammar_on_both_endpoints(tiny_engine):
    choice, regex, grammar = answer(
        tiny_engine,
        chat("Sentiment?", structured_outputs={"choice": ["positive", "negative"]}),
        chat("A date", structured_outputs={"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}),
        chat("Yes or no", structured_outputs={"grammar": 'root ::= "yes" | "no"'}),
    )
    assert content(choice) in ("positive", "negative")
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", content(regex))
    assert content(grammar) in ("yes", "no")
    (completion,) = answer(
        tiny_engine,
        {"prompt": "Label:", "max_tokens": 8, "structured_outputs": {"choice": ["spam", "ham"]}},
        url="/v1/completions",
    )
    assert completion["response"]["body"]["choices"][0]["text"] in ("spam", "ham")


def test_structured_schema_vllm_cannot_compile_is_an_error_row(tiny_engine):
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
    }
    broken, fine = answer(
        tiny_engine, chat("x", response_format=bad), chat("x", structured_outputs={"regex": "[unclosed"})
    )
    for line, field in ((broken, "response_format"), (fine, "structured_outputs")):
        assert line["error"] is not None
        assert line["response"]["body"]["error"]["param"] == field
    assert "nonsense" in broken["error"]["message"]


def test_structured_malformed_fields_are_error_rows_naming_them(tiny_engine):
    lines = answer(
        tiny_engine,
        chat("x", response_format={"type": "xml"}),
        chat("x", structured_outputs={"regex": "a", "choice": ["b"]}),
        chat("x", structured_outputs={"bogus": 1}),
        chat("x", structured_outputs={"regex": "a", "disable_any_whitespace": True}),
        chat("x", logit_bias={"not-a-token": 5}),
        chat("x", logit_bias={"5": 1000}),
        chat("x", logit_bias={"99999": 5}),
    )
    params = [line["response"]["body"]["error"]["param"] for line in lines]
    assert params == ["response_format"] + ["structured_outputs"] * 3 + ["logit_bias"] * 3


def test_logit_bias_forces_a_token(tiny_engine):
    token = tiny_engine.tokenizer.encode("Paris", add_special_tokens=False)[0]
    forced, plain = answer(
        tiny_engine,
        chat("x", max_tokens=4, ignore_eos=True, logit_bias={str(token): 100}),
        chat("x", max_tokens=4, ignore_eos=True),
    )
    assert content(forced) == tiny_engine.tokenizer.decode([token]) * 4
    assert content(forced) != content(plain)


def test_structured_schema_nesting_bound_is_vllms_own():
    """The schema check's nesting bound counts as vLLM's check does: a schema vLLM would refuse on
    every row is refused at prepare, and one it takes is taken (64 levels of objects and arrays)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import check_json_nesting

    from orchestrator.core.request.json_schema import SchemaProblem, check_json_schema

    for levels in range(58, 70):
        schema: dict = {"type": "string"}
        for _ in range(levels):  # one object each: `not` holds one subschema
            schema = {"not": schema}
        try:
            check_json_nesting(schema)
            vllm_takes = True
        except VLLMValidationError:
            vllm_takes = False
        try:
            check_json_schema(schema)
            orch_takes = True
        except SchemaProblem:
            orch_takes = False
        assert orch_takes == vllm_takes, levels


def test_structured_ref_loop_is_an_error_row_never_an_empty_success(tiny_engine):
    """A `$ref` loop: vLLM answers it with an empty text and finish_reason stop (a 200 a later run
    would reuse). The check refuses it first; and an empty answer the engine gives under a JSON
    constraint anyway (the check bypassed here) is an error row with its own code."""
    loop = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    response_format = {"type": "json_schema", "json_schema": {"name": "loop", "schema": loop}}
    (refused,) = answer(tiny_engine, chat("x", response_format=response_format))
    assert refused["error"]["code"] == "invalid_parameter"
    assert "a loop back to #/$defs/a" in refused["error"]["message"]

    request = parse_request(
        json.dumps(
            {
                "custom_id": "e",
                "url": "/v1/chat/completions",
                "body": chat("x", response_format={"type": "json_object"}),
            }
        ),
        0,
        SamplingSpec(temperature=0),
    )
    assert isinstance(request, EngineRequest)
    unchecked = Constraint("json", json.dumps(loop), "response_format")
    request = dataclasses.replace(request, params=dataclasses.replace(request.params, constraint=unchecked))
    [row] = [row for step in tiny_engine.run(iter([request])) for row in step]
    line = row.line.model_dump(mode="json")
    check_line(line)
    assert row.error and line["error"]["code"] == "empty_structured_output"
    assert line["response"]["body"]["error"]["param"] == "response_format"

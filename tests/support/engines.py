"""Driving an engine directly in a test: request lines parsed as the worker parses them, run through the
engine, every row answered once; the answers as output lines checked against the openai SDK's types."""

from __future__ import annotations

import json

from orchestrator.core.spec import SamplingSpec
from tests.support.openai_lines import check_line
from worker.requests import parse_request
from worker.wire import EngineRequest, RowResult

#: Greedy unless a line says otherwise: the tests compare answers (OpenAI's default would sample).
GREEDY = SamplingSpec(temperature=0)


def requests(*bodies, url="/v1/chat/completions"):
    """Each body as the worker parses its line (custom_id r0, r1, ...; greedy unless it says otherwise)."""
    out = []
    for i, body in enumerate(bodies):
        line = json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}).encode()
        parsed = parse_request(line, i, GREEDY)
        assert isinstance(parsed, EngineRequest), parsed.line
        out.append(parsed)
    return out


def run(engine, reqs) -> dict[str, RowResult]:
    """Every request through the engine, each answered exactly once: custom_id -> its row."""
    results = {}
    for step in engine.run(iter(reqs)):
        for row in step:
            assert row.custom_id not in results, "a row answered twice"
            results[row.custom_id] = row
    assert len(results) == len(reqs)
    return results


def body_of(row: RowResult) -> dict:
    """The row's response body (a chat completion, a text completion...)."""
    return row.line.response.body


SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "urgent": {"type": "boolean"},
    },
    "required": ["label", "urgent"],
    "additionalProperties": False,
}


def answer(engine, *bodies, url="/v1/chat/completions", defaults=None, unknown_fields="error"):
    """Each body's output line (checked against the openai SDK's types), in order: the engine's
    answer, or the error row parsing gave. `defaults`: the spec's sampling (greedy unless given);
    `unknown_fields`: the spec's `requests.unknown_fields`."""
    defaults = defaults or SamplingSpec(temperature=0)
    reqs, rows = [], {}
    for i, body in enumerate(bodies):
        parsed = parse_request(
            json.dumps({"custom_id": f"r{i}", "url": url, "body": body}), i, defaults, unknown_fields
        )
        if isinstance(parsed, EngineRequest):
            reqs.append(parsed)
        else:
            rows[parsed.custom_id] = parsed
    rows |= {row.custom_id: row for step in engine.run(iter(reqs)) for row in step}
    lines = [rows[f"r{i}"].line.model_dump(mode="json") for i in range(len(bodies))]
    for line in lines:
        check_line(line)
    return lines


def prompt_ids(engine, body, url="/v1/chat/completions"):
    """The prompt token ids orch's vLLM engine generates from for this body (its tools included)."""
    request = parse_request(json.dumps({"custom_id": "p", "url": url, "body": body}), 0, SamplingSpec(), "warn")
    assert isinstance(request, EngineRequest), request
    tools = engine._prepared_tools(request)
    prompt = engine.prompts.build(request, tools.template_tools if tools else None)
    return prompt.token_ids

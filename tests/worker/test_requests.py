"""Request lines into engine requests: each row's own parameters, the spec's defaults, clear error rows."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.spec import SamplingSpec
from worker.prompts import for_template
from worker.requests import parse_request
from worker.wire import EngineRequest, RowResult

DEFAULTS = SamplingSpec(max_tokens=100, temperature=0.3, stop=["END"])


def parse(obj, index=0, defaults=DEFAULTS):
    line = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return parse_request(line, index, defaults)


def chat(**body):
    return {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}], **body},
    }


def completion(**body):
    return {"custom_id": "p1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", **body}}


def error_of(result) -> tuple[str, str]:
    assert isinstance(result, RowResult) and result.error
    return result.line.error.code, result.line.error.message


def test_parse_request_applies_spec_defaults_where_the_row_sets_nothing():
    r = parse(chat())
    assert isinstance(r, EngineRequest) and r.kind == "chat" and r.custom_id == "c1"
    assert (r.params.max_tokens, r.params.temperature, r.params.stop, r.params.n) == (100, 0.3, ("END",), 1)
    assert r.params.logprobs is None


def test_parse_request_row_parameters_win_over_defaults():
    r = parse(
        chat(
            max_tokens=7,
            temperature=1.0,
            top_p=0.5,
            top_k=20,
            n=3,
            stop="\n",
            seed=42,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.2,
        )
    )
    p = r.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.n, p.stop, p.seed) == (7, 1.0, 0.5, 20, 3, ("\n",), 42)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)


def test_parse_request_max_completion_tokens_and_chat_logprobs():
    r = parse(chat(max_completion_tokens=9, logprobs=True, top_logprobs=3))
    assert r.params.max_tokens == 9 and r.params.logprobs == 3
    assert parse(chat(logprobs=True)).params.logprobs == 0


def test_parse_request_completion_logprobs_echo_and_prompt_list():
    r = parse(completion(prompt=["Once upon"], logprobs=2, best_of=1))
    assert r.kind == "completion" and r.prompt == "Once upon" and r.params.logprobs == 2
    assert parse(completion(echo=True)).params.echo


def test_parse_request_text_content_parts_are_joined():
    r = parse(
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    )
    assert r.messages == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize(
    "line, code",
    [
        (b"{oops", "invalid_json"),
        ({"method": "POST", "url": "/v1/chat/completions", "body": {}}, "missing_custom_id"),
        ({"custom_id": "x", "url": "/v1/moderations", "body": {"input": "a"}}, "unsupported_url"),
        (chat(functions=[{"name": "f"}]), "unsupported_parameter"),
        (chat(tools=[{"type": "function"}]), "invalid_parameter"),
        (chat(messages=[]), "invalid_messages"),
        (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "invalid_image"),  # no url
        (chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]), "unsupported_content"),
        (chat(n=True), "invalid_parameter"),
        (chat(temperature="hot"), "invalid_parameter"),
        (chat(top_logprobs=2), "invalid_parameter"),
        (completion(best_of=3), "unsupported_parameter"),
        (completion(echo=True, logprobs=1), "unsupported_parameter"),
        (completion(prompt=5), "invalid_prompt"),
    ],
)
def test_parse_request_bad_rows_become_error_rows_with_a_code(line, code):
    got, message = error_of(parse(line, index=4))
    assert got == code and message


def test_parse_request_error_row_keeps_custom_id_and_batch_shape():
    result = parse(chat(temperature=9))
    assert result.custom_id == "c1" and result.index == 0
    assert result.line.response.status_code == 400
    assert result.line.response.body["error"]["param"] == "temperature"


def test_parse_request_ignores_fields_that_change_nothing():
    assert isinstance(parse(chat(model="gpt-4o", user="u1", metadata={"a": 1})), EngineRequest)


def test_parse_request_refuses_n_samples_with_greedy_decoding_as_vllm_does():
    # orch's default temperature is 0: `n: 2` alone asks for two copies of one greedy answer.
    code, message = error_of(parse(chat(n=2), defaults=SamplingSpec()))
    assert code == "invalid_parameter" and "n must be 1 when using greedy sampling, got 2" in message
    assert isinstance(parse(chat(n=2, temperature=0.7), defaults=SamplingSpec()), EngineRequest)


@pytest.mark.parametrize("seed", [2**63, 2**64, -(2**63) - 1])
def test_parse_request_refuses_seeds_outside_int64_like_vllms_server(seed):
    code, message = error_of(parse(chat(seed=seed, temperature=0.9)))
    assert code == "invalid_parameter" and f"seed={seed}" in message
    assert parse(chat(seed=2**63 - 1, temperature=0.9)).params.seed == 2**63 - 1


def test_for_template_maps_developer_to_system_like_vllms_server():
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert for_template(developer, "{{ messages }}") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    # Several system-like messages become one, first.
    mixed = [
        {"role": "system", "content": "A."},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "B."},
    ]
    assert for_template(mixed, None) == [{"role": "system", "content": "A.\n\nB."}, {"role": "user", "content": "hi"}]
    # A template that knows the developer role gets it as it is.
    assert for_template(developer, "{% if m.role == 'developer' %}") == developer

"""Request lines into engine requests: each row's own parameters, the spec's defaults, clear error rows."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.spec import SamplingSpec
from worker.prompts import for_template, with_argument_objects
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
        (completion(prompt=5), "invalid_prompt"),
        (completion(prompt=[1, -2]), "invalid_prompt"),
        (completion(prompt=[]), "invalid_prompt"),
        (chat(use_beam_search=True), "unsupported_parameter"),
        (chat(echo=True), "unsupported_parameter"),
        (chat(chat_template="{{ x }}"), "unsupported_parameter"),
        (chat(add_generation_prompt=True, continue_final_message=True), "invalid_parameter"),
        (completion(truncate_prompt_tokens=-2), "invalid_parameter"),
        (completion(stop_token_ids=[-1]), "invalid_parameter"),
        (chat(temprature=0.2), "unsupported_parameter"),
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
    # A spec's `temperature: 0`: `n: 2` alone asks for two copies of one greedy answer.
    code, message = error_of(parse(chat(n=2), defaults=SamplingSpec(temperature=0)))
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


def weather_call(arguments, kind="function"):
    return {"id": "call_1", "type": kind, "function": {"name": "get_weather", "arguments": arguments}}


def test_with_argument_objects_parses_tool_call_arguments_like_vllms_server(caplog):
    calls = [weather_call(a) for a in ('{"city": "Paris"}', '{"city": Paris', "[1]", "", None, "null")]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "assistant", "content": "ok", "tool_calls": []},
    ]
    before = json.dumps(messages)
    parsed = with_argument_objects(messages, "row-7")
    assert [c["function"]["arguments"] for c in parsed[1]["tool_calls"]] == [{"city": "Paris"}, {}, {}, {}, {}, {}]
    assert parsed[0] == messages[0] and parsed[2] == {"role": "assistant", "content": "ok"}  # [] dropped
    assert json.dumps(messages) == before  # the request keeps what the user sent
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("row row-7" in m and "get_weather" in m for m in warned), warned


@pytest.mark.parametrize(
    "calls, where",
    [
        ("call_1", "messages[1].tool_calls must be a list"),
        ([1], "messages[1].tool_calls[0] must be an object of type 'function'"),
        ([weather_call("{}", kind="custom")], "messages[1].tool_calls[0] must be an object of type 'function'"),
        ([{"id": "call_1", "type": "function"}], "messages[1].tool_calls[0].function must be an object"),
    ],
)
def test_parse_request_refuses_tool_calls_that_are_not_function_calls(calls, where):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    code, message = error_of(parse(chat(messages=messages)))
    assert code == "invalid_messages" and message == where


def test_parse_request_absent_sampling_fields_follow_vllms_server():
    """Neither line nor spec sets them: the model's generation_config.json, else OpenAI's defaults
    (temperature 1, top_p 1); a spec default the user wrote wins over the model's."""
    from worker.bodies import with_model_defaults

    plain = parse(chat(), defaults=SamplingSpec())
    assert (plain.params.temperature, plain.params.top_p, plain.params.top_k, plain.params.min_p) == (1.0, 1.0, 0, 0.0)
    model = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1, "max_tokens": 99}
    modelled = parse(chat(), defaults=with_model_defaults(SamplingSpec(), model)).params
    assert (modelled.temperature, modelled.top_p, modelled.top_k, modelled.repetition_penalty) == (0.6, 0.9, 20, 1.1)
    written = parse(chat(), defaults=with_model_defaults(SamplingSpec(temperature=0, top_k=5), model)).params
    assert (written.temperature, written.top_p, written.top_k) == (0.0, 0.9, 5)
    assert parse(chat(temperature=0.2), defaults=with_model_defaults(SamplingSpec(), model)).params.temperature == 0.2


def test_parse_request_takes_vllms_extensions():
    r = parse(
        chat(
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            stop_token_ids=[5],
            bad_words=["no"],
            allowed_token_ids=[1, 2],
            truncate_prompt_tokens=4,
            truncation_side="left",
            continue_final_message=True,
            chat_template_kwargs={"flag": 1},
            priority=3,
            cache_salt="s",
            use_beam_search=False,
        )
    )
    assert isinstance(r, EngineRequest) and r.params.include_stop_str_in_output
    assert r.params.extensions() == [
        "include_stop_str_in_output",
        "skip_special_tokens",
        "stop_token_ids",
        "bad_words",
        "allowed_token_ids",
    ]
    o = r.prompt_options
    assert (o.truncate_prompt_tokens, o.truncation_side, o.continue_final_message, o.add_generation_prompt) == (
        4,
        "left",
        True,
        False,
    )
    assert json.loads(o.chat_template_kwargs) == {"flag": 1}


def test_parse_request_unknown_fields_error_or_ignored_with_their_names():
    line = chat(temprature=0.2, foo=1)
    code, message = error_of(parse(line))
    assert code == "unsupported_parameter" and "temprature" in message
    warned = parse_request(json.dumps(line).encode(), 0, DEFAULTS, "warn")
    assert isinstance(warned, EngineRequest) and warned.ignored == ("temprature", "foo")
    assert warned.params.temperature == DEFAULTS.temperature


def test_parse_request_unknown_field_error_says_did_you_mean():
    code, message = error_of(parse(chat(temprature=0.2)))
    assert code == "unsupported_parameter"
    assert "did you mean 'temperature'?" in message
    _, far = error_of(parse(chat(zzzzzz=1)))
    assert "did you mean" not in far


def test_body_problems_lists_every_field_in_error_unknown_first():
    from worker.requests import body_problems

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5, "temprature": 1, "top_p": 7}
    problems = body_problems("/v1/chat/completions", body, DEFAULTS)
    assert [(p.code, p.param) for p in problems] == [
        ("unsupported_parameter", "temprature"),
        ("invalid_parameter", "max_tokens"),
        ("invalid_parameter", "top_p"),
    ]
    assert body_problems("/v1/chat/completions", {**body, "max_tokens": 5, "top_p": 1}, DEFAULTS, "warn") == []


def test_parse_request_completion_prompts_as_text_or_token_ids():
    assert parse(completion(prompt=[1, 2, 3])).prompt == (1, 2, 3)
    assert parse(completion(prompt=[[4, 5]])).prompt == (4, 5)
    assert parse(completion(prompt=["one"])).prompt == "one"
    assert parse(completion(echo=True, logprobs=1)).params.echo

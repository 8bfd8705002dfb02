"""The request-field table of docs/requests.md, driven: every field fed to both real engines, each answer what the table says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec
from tests.support.engines import answer

pytestmark = pytest.mark.slow

FIELD_TABLE = Path(__file__).resolve().parents[2] / "docs" / "requests.md"
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
    "include_stop_str_in_output": {"stop": ["e"], "include_stop_str_in_output": True},
    "skip_special_tokens": {"skip_special_tokens": False},
    "spaces_between_special_tokens": {"spaces_between_special_tokens": False},
    "stop_token_ids": {"stop_token_ids": [5]},
    "bad_words": {"bad_words": ["the"]},
    "allowed_token_ids": {"allowed_token_ids": [5, 6, 7]},
    "truncate_prompt_tokens": {"truncate_prompt_tokens": 2},
    "truncation_side": {"truncate_prompt_tokens": 2, "truncation_side": "left"},
    "add_special_tokens": {"add_special_tokens": True},
    "add_generation_prompt": {"add_generation_prompt": False},
    "continue_final_message": {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "he"}],
        "continue_final_message": True,
    },
    "chat_template_kwargs": {"chat_template_kwargs": {"flag": True}},
    "documents": {"documents": [{"title": "t", "text": "x"}]},
    "priority": {"priority": 5},
    "request_id": {"request_id": "mine"},
    "session_id": {"session_id": "s-1"},
    "cache_salt": {"cache_salt": "salt"},
    "kv_transfer_params": {"kv_transfer_params": {"a": 1}},
    "ec_transfer_params": {"ec_transfer_params": {"a": 1}},
    "stream_interval": {"stream_interval": 4},
    "chat_template": {"chat_template": "{{ messages }}"},
    "mm_processor_kwargs": {"mm_processor_kwargs": {"a": 1}},
    "media_io_kwargs": {"media_io_kwargs": {"image": {}}},
    "thinking_token_budget": {"thinking_token_budget": 10},
    "use_beam_search": {"use_beam_search": True},
    "length_penalty": {"length_penalty": 0.5},
    "watermarking": {"watermarking": True},
    "prompt_logprobs": {"prompt_logprobs": 1},
    "logprob_token_ids": {"logprob_token_ids": [5]},
    "return_tokens_as_token_ids": {"return_tokens_as_token_ids": True},
    "return_token_ids": {"return_token_ids": True},
    "return_token_offsets": {"return_token_offsets": True},
    "return_prompt_text": {"return_prompt_text": True},
    "vllm_xargs": {"vllm_xargs": {"a": 1}},
    "repetition_detection": {"repetition_detection": {"max_pattern_size": 3}},
}

#: For honoured fields: (a body, the field's value) where adding the field must change vLLM's
#: answer (text, finish reason, choices, logprobs or prompt tokens). Token 5 is "#" in the tiny
#: model; `logit_bias` makes the answer predictable enough to be changed.
FORCED = {"logit_bias": {"5": 100}}
SAMPLED = {"temperature": 1.0, "seed": 1}
STOPS = {"stop": ["#"], "logit_bias": {"5": 6}}
LONGER = {"max_tokens": 24}
TEXT = "one two three four five six seven eight"
WORDS = {"chat": {"messages": [{"role": "user", "content": TEXT}]}, "completions": {"prompt": TEXT}}
CHANGES = {
    "max_tokens": ({}, {"max_tokens": 2}),
    "max_completion_tokens": ({}, {"max_completion_tokens": 2}),
    "temperature": ({"seed": 1}, {"temperature": 1.5}),
    "top_p": (SAMPLED, {"top_p": 0.01}),
    "n": (SAMPLED, {"n": 2}),
    "stop": (FORCED, {"stop": ["#"]}),
    "seed": (SAMPLED, {"seed": 2}),
    "logprobs": ({}, {"chat": {"logprobs": True}, "completions": {"logprobs": 1}}),
    "top_logprobs": ({"logprobs": True}, {"top_logprobs": 3}),
    "echo": ({}, {"echo": True}),
    "presence_penalty": (LONGER, {"presence_penalty": 2}),
    "frequency_penalty": (LONGER, {"frequency_penalty": 2}),
    "logit_bias": ({}, FORCED),
    "response_format": ({}, {"response_format": {"type": "json_object"}}),
    "tools": ({}, {"tools": [WEATHER_TOOL]}),
    "tool_choice": ({"tools": [WEATHER_TOOL]}, {"tool_choice": "required"}),
    "top_k": (SAMPLED, {"top_k": 1}),
    "min_p": (SAMPLED, {"min_p": 0.9}),
    "repetition_penalty": (LONGER, {"repetition_penalty": 2.0}),
    "min_tokens": (STOPS, {"min_tokens": 6}),
    "ignore_eos": ({"logit_bias": {"2": 100}}, {"ignore_eos": True}),
    "structured_outputs": ({}, {"structured_outputs": {"choice": ["###"]}}),
    "include_stop_str_in_output": (STOPS, {"include_stop_str_in_output": True}),
    "skip_special_tokens": ({"logit_bias": {"1": 100}}, {"skip_special_tokens": False}),
    "stop_token_ids": (FORCED, {"stop_token_ids": [5]}),
    "bad_words": (FORCED, {"bad_words": ["#"]}),
    "allowed_token_ids": ({}, {"allowed_token_ids": [6]}),
    "truncate_prompt_tokens": (WORDS, {"truncate_prompt_tokens": 3}),
    "truncation_side": (
        {e: {**b, "truncate_prompt_tokens": 3} for e, b in WORDS.items()},
        {"truncation_side": "right"},
    ),
    "add_generation_prompt": ({}, {"add_generation_prompt": False}),
    "continue_final_message": (
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "he"}]},
        {"continue_final_message": True},
    ),
}
#: Honoured fields whose effect these bodies cannot show, and why.
UNSEEN = {
    "messages": "the request itself",
    "prompt": "the request itself",
    "best_of": "only equal to n",
    "parallel_tool_calls": "needs a model that calls two tools at once",
    "spaces_between_special_tokens": "the tiny model's special tokens detokenize alike either way",
    "chat_template_kwargs": "the test template reads no variables (tests/worker/test_prompts.py renders one that does)",
    "documents": "the test template reads no documents",
    "add_special_tokens": "the tiny model's tokenizer adds no special tokens (no BOS) either way",
}


def table() -> list[tuple[str, list[str], str, str]]:
    """(field, endpoints, vLLM, transformers) for each row of docs/requests.md's field table."""
    rows = []
    for line in FIELD_TABLE.read_text().splitlines():
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
def test_fields_each_does_what_the_docs_say(engines, engine_name, endpoint):
    rows = [(field, said[engine_name == "transformers"]) for field, eps, *said in table() if endpoint in eps]
    lines = answer(engines[engine_name], *(body(field, endpoint) for field, _ in rows), url=URLS[endpoint])
    wrong = []
    for (field, said), line in zip(rows, lines, strict=True):
        failed = line["error"] is not None
        named = failed and line["response"]["body"]["error"]["param"] in body(field, endpoint)
        if (said == "error row") != failed or (failed and not named):
            wrong.append((field, said, json.dumps(line["error"])))
    assert not wrong, wrong


def with_sample(sample: dict, endpoint: str) -> dict:
    return sample.get(endpoint, sample) if endpoint in sample else sample


def test_fields_every_honoured_field_shows_its_effect_or_says_why_not():
    honoured = {field for field, _, said, _ in table() if said == "honoured"}
    assert honoured == set(CHANGES) | set(UNSEEN), honoured ^ (set(CHANGES) | set(UNSEEN))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fields_honoured_change_the_answer_and_ignored_change_nothing(engines, endpoint):
    """On vLLM: each honoured field, added to a body, changes its answer; each ignored one leaves
    the answer as it was (greedy, so that one answer is the answer)."""
    rows = {field: said for field, eps, said, _ in table() if endpoint in eps}
    pairs = []
    for field, (base, extra) in CHANGES.items():
        if rows.get(field) == "honoured":
            base = {**body("max_tokens", endpoint), "max_tokens": 6, **with_sample(base, endpoint)}
            pairs.append((field, base, with_sample(extra, endpoint)))
    for field in (f for f, said in rows.items() if said == "ignored"):
        pairs.append((field, body("max_tokens", endpoint), with_sample(SAMPLES[field], endpoint)))
    bodies = [b for _, base, extra in pairs for b in (base, {**base, **extra})]
    lines = answer(engines["vLLM"], *bodies, url=URLS[endpoint])
    wrong = []
    for i, (field, _, _) in enumerate(pairs):
        before, after = (comparable(line) for line in lines[2 * i : 2 * i + 2])
        if "error" in before or "error" in after or (before == after) != (rows[field] == "ignored"):
            wrong.append((field, rows[field], before, after))
    assert not wrong, ([w[0] for w in wrong], wrong)


def comparable(line: dict) -> dict:
    if line["error"] is not None:
        return {"error": line["error"]}
    body = line["response"]["body"]
    choices = [{k: v for k, v in c.items() if k != "index"} for c in body["choices"]]
    return {"choices": choices, "prompt_tokens": body["usage"]["prompt_tokens"]}

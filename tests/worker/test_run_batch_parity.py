"""One input file through vLLM's own `run_batch` and through orch's engine: the answers match token for token."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from model_builders import TOOLS_CHAT_TEMPLATE, WEATHER_TOOL
from orchestrator.core.spec import ModelSpec, SamplingSpec
from tests.support.engines import SCHEMA, answer, prompt_ids
from tests.support.models import COMPACT_JSON

pytestmark = pytest.mark.slow

CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}\n</tool_call>'
#: What vLLM's lines add: their prompt token ids in the answer (orch's are read off its engine).
IDS = {"return_token_ids": True}
PROMPTS = ["Hello", "What is 2+2?", "Name a colour.", "Tell me a joke.", "Translate cat to French.", "Why?"]


def msg(i, **body):
    return {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": 16, **body}


def called(*arguments: str, then: str = "And in Rome?", **body) -> dict:
    """A greedy line whose history holds an assistant turn calling get_weather once per `arguments`
    (the JSON text OpenAI's API carries), each call's answer, and a user turn."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": a}}
        for i, a in enumerate(arguments)
    ]
    answers = [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    return {
        "messages": [*history, *answers, {"role": "user", "content": then}],
        "max_tokens": 16,
        "temperature": 0,
        **body,
    }


#: The differential's kind of file: greedy, stop strings, seeded sampling (with and without a
#: temperature: absent means the model's default, else OpenAI's 1.0, in both), n with a seed,
#: every kind of constraint, logit_bias, tools, earlier tool calls in the history (one, two, and
#: arguments that are not JSON or not an object: the template gets {}), vLLM's extensions, and an
#: unknown key (vLLM ignores it; orch too under `requests.unknown_fields: warn`). 65 lines.
BODIES = [
    *(msg(i, temperature=0) for i in range(6)),
    *(msg(i, temperature=0, stop=stop) for i, stop in enumerate(["e", " ", ["a", "o"], "\n"])),
    *(msg(i, temperature=t, seed=10 + i) for i, t in enumerate([0.5, 0.7, 1.0, 1.3])),
    *(msg(i, temperature=0.8, top_p=0.9, seed=20 + i) for i in range(2)),
    *(msg(i, seed=30 + i) for i in range(4)),  # no temperature
    msg(0, top_p=0.8, seed=40),  # no temperature, a top_p
    *(msg(i, temperature=0.9, n=2, seed=50 + i) for i in range(3)),
    msg(1, n=3, seed=55),  # n without a temperature: sampled at 1.0 in both
    {
        **msg(1, temperature=0),
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    },
    {
        **msg(2, temperature=0.7, seed=3),
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    },
    {**msg(3, temperature=0), "max_tokens": 32, "response_format": {"type": "json_object"}},
    msg(4, temperature=0, max_tokens=8, structured_outputs={"choice": ["spam", "ham"]}),
    msg(5, seed=4, max_tokens=8, structured_outputs={"choice": ["yes", "no", "maybe"]}),
    msg(0, temperature=0, structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"}),
    msg(1, temperature=1.0, seed=5, structured_outputs={"regex": "(cat|dog)s?"}),
    msg(2, temperature=0, structured_outputs={"grammar": 'root ::= "yes" | "no"'}),
    msg(3, temperature=0, logit_bias={"5": 8, "17": 5}),
    msg(4, temperature=0.8, seed=6, logit_bias={"9": -100}),
    {
        **msg(0, temperature=0),
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "max_tokens": 200,
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "structured_outputs": {"regex": CALL},
    },
    {
        **msg(0, temperature=0),
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 64,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    {**msg(0, temperature=0), "tools": [WEATHER_TOOL], "tool_choice": "none"},
    called('{"city": "Paris"}', tools=[WEATHER_TOOL]),
    called('{"city": "Paris"}', '{"city": "Rome"}', then="Which is warmer?", tools=[WEATHER_TOOL]),
    called('{"city": Paris'),
    called('["Paris"]', ""),
    msg(0, temperature=0, stop=["e"], include_stop_str_in_output=True),
    msg(1, temperature=0, stop=" ", include_stop_str_in_output=True),
    msg(2, temperature=0, min_tokens=12, stop=["e"]),
    msg(3, temperature=0.9, seed=7, min_tokens=10),
    msg(4, temperature=0, repetition_penalty=1.5),
    msg(5, temperature=0.8, seed=8, repetition_penalty=0.8),
    msg(0, temperature=1.0, seed=9, top_k=5),
    msg(1, temperature=1.0, seed=10, min_p=0.1),
    msg(2, temperature=0, stop_token_ids=[100, 101]),
    msg(3, temperature=0, bad_words=["the", "a"]),
    msg(4, temperature=0, ignore_eos=True),
    msg(5, temperature=0, skip_special_tokens=False),
    msg(0, temperature=0, spaces_between_special_tokens=False),
    msg(1, temperature=0, presence_penalty=1.5),
    msg(2, temperature=0.7, seed=11, frequency_penalty=-1.0),
    {**msg(3, temperature=0), "max_completion_tokens": 9},
    {
        **msg(4, temperature=0),
        "messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi the"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    msg(5, temperature=0, chat_template_kwargs={"unused": True}),
    {**msg(0, temperature=0), "messages": [{"role": "user", "content": "word " * 40}], "truncate_prompt_tokens": 20},
    msg(1, temperature=0, logprobs=True, top_logprobs=3),
    msg(2, temperature=0.9, seed=12, logprobs=True),
    msg(3, temperature=0, user="u-1", metadata={"k": "v"}, priority=2, cache_salt="salt", request_id="mine"),
    msg(4, temperature=0, some_unknown_key=1),
]
assert len(BODIES) == 65, len(BODIES)


def comparable(line: dict) -> dict:
    """What must agree: every choice's text, tool calls (ids are random), finish reason and
    logprobs (tokens exactly, values to 1e-4: another process, other batches), the token counts."""
    body = line["response"]["body"]
    choices = []
    for choice in body["choices"]:
        logprobs = (choice.get("logprobs") or {}).get("content")
        choices.append(
            {
                "content": choice["message"]["content"] or "",
                "tool_calls": [c["function"] for c in choice["message"].get("tool_calls") or []],
                "finish_reason": choice["finish_reason"],
                "logprobs": [
                    (t["token"], round(t["logprob"], 4), [x["token"] for x in t["top_logprobs"]]) for t in logprobs
                ]
                if logprobs
                else None,
            }
        )
    return {"choices": choices, "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")}}


def test_run_batch_parity_answers_match(tiny_engine, tiny_model, tmp_path):
    from worker.engine.vllm_engine import VllmEngine

    requests = tmp_path / "in.jsonl"
    requests.write_text(
        "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": b | IDS}) + "\n"
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
    ours = answer(engine, *BODIES, defaults=SamplingSpec(), unknown_fields="warn")
    assert sorted(theirs) == sorted(f"r{i}" for i in range(len(BODIES)))  # every custom_id once
    refused = [i for i in range(len(BODIES)) if theirs[f"r{i}"]["error"] is not None or ours[i]["error"] is not None]
    assert not refused, [(i, theirs[f"r{i}"]["error"], ours[i]["error"]) for i in refused]
    # The prompts, token for token (vLLM's lines carry theirs under return_token_ids).
    prompts = [prompt_ids(engine, b) for b in BODIES]
    differ = [i for i, ids in enumerate(prompts) if ids != theirs[f"r{i}"]["response"]["body"]["prompt_token_ids"]]
    assert not differ, [
        (i, len(prompts[i]), len(theirs[f"r{i}"]["response"]["body"]["prompt_token_ids"])) for i in differ
    ]
    differ = [i for i, line in enumerate(ours) if comparable(line) != comparable(theirs[f"r{i}"])]
    assert not differ, [(i, BODIES[i], comparable(ours[i]), comparable(theirs[f"r{i}"])) for i in differ]
    forced = [i for i, b in enumerate(BODIES) if b.get("structured_outputs") == {"regex": CALL}]
    assert forced and all(comparable(ours[i])["choices"][0]["tool_calls"] for i in forced), "the call was not parsed"
    # The lines exercise what they say: n choices, logprobs, an echoed stop string.
    assert sum(len(comparable(line)["choices"]) > 1 for line in ours) == 4
    assert sum(comparable(line)["choices"][0]["logprobs"] is not None for line in ours) == 2

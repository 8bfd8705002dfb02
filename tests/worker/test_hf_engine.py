"""The transformers engine: the same interface and output lines as vLLM, for machines without vLLM."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.spec import ModelSpec, SamplingSpec
from worker.requests import parse_request
from worker.wire import EngineRequest

pytestmark = pytest.mark.slow

#: Greedy unless a line says otherwise: the tests compare answers (OpenAI's default would sample).
GREEDY = SamplingSpec(temperature=0)


@pytest.fixture(scope="module")
def hf_engine(smollm2_model):
    from worker.engine.hf_engine import TransformersEngine

    return TransformersEngine(ModelSpec(name=smollm2_model, engine="transformers"), batch_size=4)


def run(engine, *bodies, url="/v1/chat/completions"):
    reqs = []
    for i, body in enumerate(bodies):
        parsed = parse_request(json.dumps({"custom_id": f"r{i}", "url": url, "body": body}), i, GREEDY)
        assert isinstance(parsed, EngineRequest)
        reqs.append(parsed)
    out = {}
    for step in engine.run(iter(reqs)):
        for row in step:
            out[row.custom_id] = row
    assert len(out) == len(reqs)
    return out


def test_hf_engine_answers_like_the_chat_api(hf_engine):
    out = run(
        hf_engine, {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20}
    )
    body = out["r0"].line.response.body
    assert body["object"] == "chat.completion" and "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == out["r0"].tokens_in > 0
    # transformers keeps no cache between requests: nothing cached, said as vLLM's lines say it.
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and out["r0"].tokens_cached == 0


def test_hf_engine_per_request_parameters_in_one_window(hf_engine):
    out = run(
        hf_engine,
        {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 3, "ignore_eos": True},
        {
            "messages": [{"role": "user", "content": "Count"}],
            "max_tokens": 6,
            "ignore_eos": True,
            "n": 2,
            "temperature": 0.9,
            "seed": 3,
        },
    )
    assert out["r0"].tokens_out == 3
    two = out["r1"].line.response.body
    assert len(two["choices"]) == 2 and two["usage"]["completion_tokens"] == 12


def test_hf_engine_completion_logprobs(hf_engine):
    out = run(
        hf_engine, {"prompt": "1, 2, 3,", "max_tokens": 4, "logprobs": 2, "ignore_eos": True}, url="/v1/completions"
    )
    choice = out["r0"].line.response.body["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == 4 and all(len(alts) <= 2 for alts in lp["top_logprobs"])
    assert all(x <= 0 for x in lp["token_logprobs"])


def test_hf_engine_stop_string_keeps_the_tokens_it_generated(hf_engine):
    """A stop string cuts the text, not the record of generation: the tokens counted and their
    logprobs are the ones generated, up to the token that completed the stop string (as vLLM)."""
    ask = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20}
    ask.update(logprobs=True, top_logprobs=1)
    out = run(hf_engine, ask, {**ask, "stop": ["Paris"]})
    free, stopped = (out[r].line.response.body for r in ("r0", "r1"))
    generated = [t["token"] for t in free["choices"][0]["logprobs"]["content"]]
    kept = [t["token"] for t in stopped["choices"][0]["logprobs"]["content"]]
    text = stopped["choices"][0]["message"]["content"]
    assert "Paris" in free["choices"][0]["message"]["content"] and "Paris" not in text
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert kept == generated[: len(kept)] and "Paris" in kept[-1]  # the stop string's own token is counted
    assert stopped["usage"]["completion_tokens"] == len(kept)
    assert "".join(kept).startswith(text)


def test_hf_engine_refuses_penalties_it_cannot_apply(hf_engine):
    out = run(hf_engine, {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1.0})
    assert out["r0"].error and out["r0"].line.error.code == "unsupported_parameter"


#: A GPU machine with only PyTorch and transformers (docs/BENCHMARKS.md): these are not installed there.
ABSENT_ON_A_BARE_GPU_MACHINE = ("vllm", "accelerate", "boto3", "botocore")
WITHOUT_THEM = """
import json, sys
for name in {absent!r}:
    sys.modules[name] = None  # as if not installed: import fails, find_spec answers None
from orchestrator.core.spec import ModelSpec, SamplingSpec
from worker.engine.hf_engine import TransformersEngine
from worker.requests import parse_request

engine = TransformersEngine(ModelSpec(name={model!r}, engine="transformers"))
line = json.dumps({{"custom_id": "r0", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 3,
                   "ignore_eos": True}}}})
rows = [row for step in engine.run(iter([parse_request(line, 0, SamplingSpec())])) for row in step]
print(json.dumps([row.tokens_out for row in rows]))
"""


def test_hf_engine_runs_with_only_torch_and_transformers(tiny_model):
    import os
    import subprocess
    import sys

    code = WITHOUT_THEM.format(absent=ABSENT_ON_A_BARE_GPU_MACHINE, model=tiny_model)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [3]

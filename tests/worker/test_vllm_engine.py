"""The vLLM engine on the CPU: per-request parameters, n > 1, logprobs, error rows, a bounded window."""

from __future__ import annotations

import pytest

from tests.support.engines import body_of, requests, run

pytestmark = pytest.mark.slow


def msg(text, **params):
    return {"messages": [{"role": "user", "content": text}], **params}


def test_vllm_engine_honours_max_tokens_per_request(tiny_engine):
    out = run(tiny_engine, requests(msg("a", max_tokens=3, ignore_eos=True), msg("b", max_tokens=11, ignore_eos=True)))
    assert out["r0"].tokens_out == 3 and out["r1"].tokens_out == 11
    assert body_of(out["r0"])["usage"]["completion_tokens"] == 3
    assert body_of(out["r1"])["choices"][0]["finish_reason"] == "length"


def test_vllm_engine_greedy_is_deterministic_and_stop_truncates(tiny_engine):
    first = body_of(run(tiny_engine, requests(msg("hello", max_tokens=24, ignore_eos=True)))["r0"])
    text = first["choices"][0]["message"]["content"]
    again = body_of(run(tiny_engine, requests(msg("hello", max_tokens=24, ignore_eos=True)))["r0"])
    assert again["choices"][0]["message"]["content"] == text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"no usable stop string in {text!r}"
    stopped = body_of(run(tiny_engine, requests(msg("hello", max_tokens=24, stop=[stop])))["r0"])
    content = stopped["choices"][0]["message"]["content"]
    assert stop not in content and text.startswith(content)
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_vllm_engine_n_samples_and_seed_reproduces(tiny_engine):
    body = msg("seeded", max_tokens=12, n=3, temperature=1.0, seed=7, ignore_eos=True)
    one = body_of(run(tiny_engine, requests(body))["r0"])
    two = body_of(run(tiny_engine, requests(body))["r0"])
    texts = [c["message"]["content"] for c in one["choices"]]
    assert len(texts) == 3 and [c["index"] for c in one["choices"]] == [0, 1, 2]
    assert texts == [c["message"]["content"] for c in two["choices"]]
    assert len(set(texts)) > 1  # three samples at temperature 1, not three copies
    assert one["usage"]["completion_tokens"] == 36


def test_vllm_engine_chat_logprobs_shape(tiny_engine):
    body = body_of(
        run(tiny_engine, requests(msg("x", max_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=2)))["r0"]
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for token in content:
        assert token["logprob"] <= 0 and len(token["top_logprobs"]) == 2
        assert token["top_logprobs"][0]["logprob"] >= token["top_logprobs"][1]["logprob"]
        assert bytes(token["bytes"]).decode() == token["token"]


def test_vllm_engine_completion_logprobs_shape(tiny_engine):
    reqs = requests({"prompt": "Once upon", "max_tokens": 4, "ignore_eos": True, "logprobs": 3}, url="/v1/completions")
    body = body_of(run(tiny_engine, reqs)["r0"])
    assert body["object"] == "text_completion"
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert all(len(alts) <= 3 for alts in lp["top_logprobs"])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]


def test_vllm_engine_completion_echo_prefixes_the_prompt(tiny_engine):
    reqs = requests({"prompt": "Echo me", "max_tokens": 3, "ignore_eos": True, "echo": True}, url="/v1/completions")
    assert body_of(run(tiny_engine, reqs)["r0"])["choices"][0]["text"].startswith("Echo me")


def test_vllm_engine_one_bad_row_does_not_sink_the_others(tiny_engine):
    long = "word " * 2000  # far beyond the tiny model's 1,024-token context
    out = run(tiny_engine, requests(msg("fine", max_tokens=4), msg(long, max_tokens=4), msg("also fine", max_tokens=4)))
    assert not out["r0"].error and not out["r2"].error
    assert out["r1"].error and out["r1"].line.error.code == "context_length_exceeded"
    assert out["r1"].index == 1


def test_vllm_engine_pulls_requests_through_a_bounded_window(tiny_engine, monkeypatch):
    # One engine per process: vLLM keeps global state, so the session's engine gets a small window.
    monkeypatch.setattr(tiny_engine, "max_in_flight", 4)
    pulled, finished, worst = 0, 0, 0

    def feed():
        nonlocal pulled
        for r in requests(*[msg(f"q{i}", max_tokens=6, ignore_eos=True) for i in range(40)]):
            pulled += 1
            yield r

    for step in tiny_engine.run(feed()):
        finished += len(step)
        worst = max(worst, pulled - finished)
    assert finished == 40 and worst <= 4


def test_vllm_engine_abort_drops_requests_in_flight(tiny_engine):
    steps = tiny_engine.run(iter(requests(*[msg(f"q{i}", max_tokens=200, ignore_eos=True) for i in range(8)])))
    next(steps)
    tiny_engine.abort()
    steps.close()
    # The engine is clean: the next run answers exactly its own rows.
    assert set(run(tiny_engine, requests(msg("after", max_tokens=2)))) == {"r0"}


def test_vllm_engine_a_request_vllm_refuses_is_that_rows_error(tiny_engine):
    """Whatever vLLM refuses at admission becomes that row's error, with vLLM's message, as its
    server answers (400): here a greedy `n: 2`, handed over without the parser's own check."""
    from dataclasses import replace

    good, bad, after = requests(msg("a", max_tokens=3), msg("b", max_tokens=3), msg("c", max_tokens=3))
    bad.params = replace(bad.params, n=2, temperature=0.0)
    out = run(tiny_engine, [good, bad, after])
    assert not out["r0"].error and not out["r2"].error
    error = out["r1"].line
    assert error.error.code == "invalid_request" and "n must be 1 when using greedy sampling" in error.error.message
    assert error.response.status_code == 400 and error.response.body["error"]["type"] == "invalid_request_error"

"""`/v1/completions` lines through orch and through vLLM's own serving code: the same answer.

vLLM's `run_batch` does not serve completions (FACTS.md), so vLLM's side is its serving classes
driven in process on the same `LLM`: `CompletionRequest.to_sampling_params` turns each body into
SamplingParams, `LLM.generate` answers (a prompt list as several prompts, token ids as
`prompt_token_ids`), and `OpenAIServingCompletion.request_output_to_completion_response` builds
the response body, the code its server answers with.
"""

from __future__ import annotations

import pytest

from tests.support.engines import answer

pytestmark = pytest.mark.slow

URL = "/v1/completions"
BODIES = [
    {"prompt": "The sea is", "max_tokens": 8, "temperature": 0},
    {"prompt": "The sea is", "max_tokens": 6, "temperature": 0, "echo": True},
    {"prompt": "Once upon", "max_tokens": 5, "temperature": 0, "echo": True, "logprobs": 2},
    {"prompt": "Once upon", "max_tokens": 5, "temperature": 0, "logprobs": 0},
    {"prompt": ["One", "Two words", "Three little words"], "max_tokens": 4, "temperature": 0},
    {"prompt": ["Red", "Blue"], "max_tokens": 4, "temperature": 0.9, "seed": 7, "n": 2},
    {"prompt": [5, 17, 33, 60], "max_tokens": 5, "temperature": 0},
    {"prompt": [[5, 17], [40, 41, 42]], "max_tokens": 3, "temperature": 0, "echo": True},
    {"prompt": "A line without temperature", "max_tokens": 8, "seed": 11},
    {
        "prompt": "Stop here. Or not",
        "max_tokens": 12,
        "temperature": 0,
        "stop": ["e"],
        "include_stop_str_in_output": True,
    },
    {"prompt": "Penalties", "max_tokens": 8, "temperature": 0, "repetition_penalty": 1.3, "min_tokens": 4},
    {"prompt": "Top k", "max_tokens": 8, "temperature": 0.8, "seed": 3, "top_k": 5, "min_p": 0.05},
]


def vllm_bodies(llm, bodies):
    """Each body's response body from vLLM's own serving code (no server, the same engine)."""
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    serving = object.__new__(OpenAIServingCompletion)  # its response builder needs no engine client
    serving.return_tokens_as_token_ids = False
    serving.enable_prompt_tokens_details = False
    serving.enable_per_request_metrics = False
    serving.system_fingerprint = None
    defaults = llm.llm_engine.model_config.get_diff_sampling_param()
    tokenizer = llm.get_tokenizer()
    out = []
    for body in bodies:
        request = CompletionRequest(model="m", **body)
        prompts = request.prompt if isinstance(request.prompt, list) else [request.prompt]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        inputs = [{"prompt_token_ids": p} if isinstance(p, list) else p for p in prompts]
        params = request.to_sampling_params(request.max_tokens, defaults)
        results = llm.generate(inputs, params, use_tqdm=False)
        for result, given in zip(results, inputs, strict=True):
            if isinstance(given, dict):  # the server detokenizes a token-id prompt it echoes
                result.prompt = tokenizer.decode(given["prompt_token_ids"])
        response = serving.request_output_to_completion_response(
            results, request, "cmpl-x", 0, "m", tokenizer, RequestResponseMetadata(request_id="x")
        )
        out.append(response.model_dump(mode="json"))
    return out


def comparable(body):
    return {
        "choices": [
            {"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": c["logprobs"]}
            for c in body["choices"]
        ],
        "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }


def test_completions_answer_as_vllms_serving_code(tiny_engine):
    from orchestrator.core.spec import SamplingSpec

    ours = answer(tiny_engine, *BODIES, url=URL, defaults=SamplingSpec())
    theirs = vllm_bodies(tiny_engine.llm, BODIES)
    for i, (line, body) in enumerate(zip(ours, theirs, strict=True)):
        assert line["error"] is None, (i, line["error"])
        assert comparable(line["response"]["body"]) == comparable(body), (i, BODIES[i])
    # What the lines exercise really happened.
    assert len(ours[4]["response"]["body"]["choices"]) == 3 and len(ours[5]["response"]["body"]["choices"]) == 4
    echoed = ours[2]["response"]["body"]["choices"][0]
    assert echoed["text"].startswith("Once upon") and echoed["logprobs"]["token_logprobs"][0] is None

"""OpenAI Batch output lines, built the same way whichever engine generated the text.

A success line:
    {"id": "batch_req_<chunk>-<row>", "custom_id": ..., "error": null,
     "response": {"status_code": 200, "request_id": ..., "body": <chat.completion | text_completion>}}
An error line (one row failed alone: bad parameters, a prompt longer than the context...):
    {"id": ..., "custom_id": ..., "error": {"code": ..., "message": ...},
     "response": {"status_code": 400 (500 for engine failures), "request_id": ...,
                  "body": {"error": {"message", "type", "param", "code"}}}}
so `line["error"] is not None` tells an error row apart, and the response still reads like the
HTTP answer the OpenAI API would have given. The `id` is set when the part is written
(orchestrator.core.protocol.parts): it names the chunk and row.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.lines import BatchOutputLine, BatchResponse, new_request_id
from worker.responses import output_items, response_body
from worker.wire import EngineRequest


@dataclass
class TokenLogprob:
    token: str
    #: None for a prompt's first token (completions' `echo` with `logprobs`): nothing comes before it.
    logprob: float | None
    #: The most likely tokens at this position, most likely first (may include the chosen one).
    top: list[tuple[str, float]] | None


@dataclass
class Choice:
    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls"
    tokens: int
    logprobs: list[TokenLogprob] | None = None
    #: Calls parsed out of the text (chat with tools): OpenAI's `message.tool_calls`; `text` is then
    #: what the parser left as content.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    #: What completions' `echo` puts before the text: the prompt it answers.
    echo: str = ""
    #: The model's reasoning, read off by the run's reasoning parser (None: the run has none, or the
    #: model did not reason); `reasoning_tokens` how many generated tokens it took (None: no parser).
    reasoning: str | None = None
    reasoning_tokens: int | None = None


def success_line(
    request: EngineRequest, choices: list[Choice], prompt_tokens: int, model: str, *, cached_tokens: int = 0
) -> BatchOutputLine:
    completion_tokens = sum(c.tokens for c in choices)
    # As vLLM's server writes it with --enable-prompt-tokens-details, always (OpenAI's Batch lines
    # always carry it): the prompt tokens its prefix cache already held.
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    reasoning_counts = [c.reasoning_tokens for c in choices if c.reasoning_tokens is not None]
    if reasoning_counts:  # as vLLM's server: given when the run has a reasoning parser
        usage["completion_tokens_details"] = {"reasoning_tokens": sum(reasoning_counts)}
    request_id = new_request_id()
    body: dict[str, Any]
    if request.kind == "response":
        assert request.response is not None and len(choices) == 1
        c = choices[0]
        items = output_items(c.reasoning, c.text, c.tool_calls)
        cut = c.finish_reason == "length"
        body = response_body(
            request.response, model=model, items=items, cut=cut, usage=usage, reasoning_tokens=sum(reasoning_counts)
        )
    else:
        body = _choices_body(request.kind, choices, model, usage, request_id)
    return BatchOutputLine(
        custom_id=request.custom_id, response=BatchResponse(status_code=200, request_id=request_id, body=body)
    )


def _choices_body(
    kind: str, choices: list[Choice], model: str, usage: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """A chat completion's or a text completion's body, as vLLM's server writes it."""
    chat = kind == "chat"
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(i, c, chat) for i, c in enumerate(choices)],
        "usage": usage,
    }


def _choice(index: int, c: Choice, chat: bool) -> dict[str, Any]:
    if chat:
        logprobs = _chat_logprobs(c.logprobs) if c.logprobs is not None else None
        return {"index": index, "message": _message(c), "logprobs": logprobs, "finish_reason": c.finish_reason}
    logprobs = _completion_logprobs(c.logprobs) if c.logprobs is not None else None
    return {"index": index, "text": c.echo + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}


def embedding_line(request: EngineRequest, vectors: list[Any], prompt_tokens: int, model: str) -> BatchOutputLine:
    """An embeddings line's success: OpenAI's embedding list, in the request's encoding."""
    assert request.embedding is not None
    body = embedding_body(vectors, request.embedding.encoding_format, prompt_tokens, model)
    return BatchOutputLine(
        custom_id=request.custom_id,
        response=BatchResponse(status_code=200, request_id=body["id"].removeprefix("embd-"), body=body),
    )


def embedding_body(vectors: list[Any], encoding: str, prompt_tokens: int, model: str) -> dict[str, Any]:
    """OpenAI's embeddings response (`CreateEmbeddingResponse`), with the `id` and `created` vLLM adds."""
    return {
        "id": f"embd-{new_request_id()}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": i, "object": "embedding", "embedding": _base64(v) if encoding == "base64" else v}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def scoring_line(request: EngineRequest, scores: list[float], prompt_tokens: int, model: str) -> BatchOutputLine:
    """A score or rerank line's success, shaped as vLLM's ScoreResponse / RerankResponse: a score per
    pair in input order, or the documents by score, best first (the best `top_n`, when set)."""
    assert request.scoring is not None
    request_id = new_request_id()
    body: dict[str, Any]
    if request.kind == "score":
        body = {
            "id": f"score-{request_id}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
    else:
        ranked = sorted(enumerate(scores), key=lambda pair: pair[1], reverse=True)  # stable, as vLLM's sort
        documents = request.scoring.documents
        results = [
            {"index": i, "document": {"text": documents[i], "multi_modal": None}, "relevance_score": s}
            for i, s in ranked
        ]
        top_n = request.scoring.top_n or len(results)
        body = {
            "id": f"score-{request_id}",
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": results[:top_n],
        }
    return BatchOutputLine(
        custom_id=request.custom_id, response=BatchResponse(status_code=200, request_id=request_id, body=body)
    )


def _base64(vector: list[float]) -> str:
    """A vector as OpenAI's `encoding_format: base64` gives it: little-endian float32 bytes."""
    import numpy as np  # not a dependency of orch: the worker has it through torch

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def _message(choice: Choice) -> dict[str, Any]:
    # vLLM's field for a reasoning model's thinking (its server's `message.reasoning`).
    thought = {"reasoning": choice.reasoning} if choice.reasoning_tokens is not None else {}
    if not choice.tool_calls:
        return {"role": "assistant", "content": choice.text, **thought}
    # As OpenAI answers a call: no content unless the model wrote some beside it.
    return {"role": "assistant", "content": choice.text or None, **thought, "tool_calls": choice.tool_calls}


def _chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.token.encode()),
                "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.top or ()],
            }
            for t in tokens
        ]
    }


def _completion_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's completion logprobs; `text_offset` counts from the start of the choice's text
    (echoed prompt included), as vLLM's server does."""
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) if t.top is not None else None for t in tokens],
        "text_offset": offsets,
    }

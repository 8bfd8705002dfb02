"""`/v1/embeddings` lines: their body parsed, run on vLLM's pooling runner, answered as OpenAI's embedding list.

A line's `input` is a string, a list of strings, a list of token ids or a list of such lists;
each item is one engine request, and the line is answered once all of its items are (one
`data[]` entry per item, in order). `dimensions` asks a Matryoshka model for a prefix of its
vector (vLLM refuses what the model does not support: an error row); `encoding_format: base64`
gives each vector as little-endian float32 bytes in base64, as OpenAI's API does.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from worker.engine.base import RowResult, error_row
from worker.engine.vllm_engine import InFlight, VllmEngine, engine_refusal
from worker.requests import BadRequest, EngineRequest

#: Fields an embeddings body may carry; `model` and `user` change nothing here.
_FIELDS = {"input", "dimensions", "encoding_format", "model", "user"}
#: OpenAI's limit on inputs per request.
MAX_INPUTS = 2048


@dataclass(frozen=True)
class EmbeddingInput:
    items: tuple[str | tuple[int, ...], ...]
    dimensions: int | None
    encoding_format: str  # "float" or "base64"


def parse_embedding_body(body: dict[str, Any]) -> EmbeddingInput:
    for key in body:
        if key not in _FIELDS:
            raise BadRequest("unsupported_parameter", f"parameter {key!r} is not supported for embeddings", key)
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_token(t) for t in raw)):
        raw = [raw]  # one input: a string or one list of token ids
    if not isinstance(raw, list) or not raw:
        raise BadRequest(
            "invalid_input", "input must be a string, a list of strings or a list of token id lists", "input"
        )
    if len(raw) > MAX_INPUTS:
        raise BadRequest("invalid_input", f"input has {len(raw)} items; at most {MAX_INPUTS}", "input")
    items: list[str | tuple[int, ...]] = []
    for i, item in enumerate(raw):
        if isinstance(item, str) and item:
            items.append(item)
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            items.append(tuple(item))
        else:
            raise BadRequest(
                "invalid_input", f"input[{i}] must be a non-empty string or a non-empty list of token ids", "input"
            )
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _is_token(dimensions) or dimensions < 1):
        raise BadRequest("invalid_parameter", f"dimensions={dimensions!r}: expected an integer >= 1", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding == "float" or encoding == "base64":
        return EmbeddingInput(tuple(items), dimensions, encoding)
    raise BadRequest(
        "invalid_parameter", f"encoding_format={encoding!r}: expected 'float' or 'base64'", "encoding_format"
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class _Line:
    """An embeddings line whose items are in the engine: the vectors that came back so far."""

    request: EngineRequest
    vectors: list[list[float] | None]
    prompt_tokens: int = 0
    waiting: set[str] = field(default_factory=set)


class VllmEmbeddingEngine(VllmEngine):
    """The vLLM engine on its pooling runner: the same streaming loop, one engine request per input item."""

    name = "vllm"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.vocab_size = self._engine.model_config.get_vocab_size()
        self._lines: dict[str, _Line] = {}

    def abort(self, chunk: str | None = None) -> None:
        super().abort(chunk)
        for key in [k for k, line in self._lines.items() if chunk is None or line.request.chunk == chunk]:
            del self._lines[key]

    def _add(self, request: EngineRequest) -> RowResult | None:
        from vllm.pooling_params import PoolingParams

        if request.embedding is None:
            return error_row(
                request, "unsupported_url", "this run embeds (model.runner: pooling): only /v1/embeddings lines"
            )
        try:
            lora = self._adapters.for_model(request.model)
            prompts = [self._tokens(item, i) for i, item in enumerate(request.embedding.items)]
        except BadRequest as e:
            return error_row(request, e.code, str(e), param=e.param)
        key = str(self._next_id)
        self._next_id += 1
        line = _Line(request, [None] * len(prompts))
        try:
            for i, ids in enumerate(prompts):
                request_id = f"{key}.{i}"
                params = PoolingParams(task="embed", dimensions=request.embedding.dimensions)
                self._engine.add_request(request_id, {"prompt_token_ids": ids}, params, lora_request=lora)
                self._in_flight[request_id] = InFlight(request, len(ids))
                line.waiting.add(request_id)
        except Exception as e:
            refusal = engine_refusal(e)
            if line.waiting:  # the items added before the refused one
                self._engine.abort_request(list(line.waiting))
                for request_id in line.waiting:
                    del self._in_flight[request_id]
            if refusal is None:
                raise  # not about this request: the engine itself is in trouble
            param = refusal[1] or ("dimensions" if "dimension" in refusal[0].lower() else None)
            return error_row(request, "invalid_request", refusal[0], param=param)
        self._lines[key] = line
        return None

    def _tokens(self, item: str | tuple[int, ...], index: int) -> list[int]:
        # Like vLLM's server: a string is tokenised with the model's special tokens.
        ids = list(self.tokenizer.encode(item)) if isinstance(item, str) else list(item)
        if isinstance(item, tuple) and max(ids) >= self.vocab_size:
            raise BadRequest(
                "invalid_input",
                f"input[{index}] has token id {max(ids)}; the vocabulary has {self.vocab_size}",
                "input",
            )
        if len(ids) > self.max_model_len:
            raise BadRequest(
                "context_length_exceeded",
                f"this model's maximum context length is {self.max_model_len} tokens; input[{index}] has {len(ids)}",
                "input",
            )
        return ids

    def _result(self, output: Any) -> RowResult | None:
        flight = self._in_flight.pop(output.request_id)
        key, position = output.request_id.rsplit(".", 1)
        line = self._lines[key]
        line.vectors[int(position)] = output.outputs.data.tolist()
        line.prompt_tokens += flight.prompt_tokens
        line.waiting.discard(output.request_id)
        if line.waiting:
            return None
        del self._lines[key]
        request = line.request
        assert request.embedding is not None
        model = request.model if self._adapters.for_model(request.model) is not None else self.model_name
        body = embedding_body(line.vectors, request.embedding.encoding_format, line.prompt_tokens, model or "")
        return RowResult(
            request.index, request.custom_id, _success(request, body), line.prompt_tokens, 0, False, request.chunk
        )


def embedding_body(vectors: list[Any], encoding: str, prompt_tokens: int, model: str) -> dict[str, Any]:
    """OpenAI's embeddings response (`CreateEmbeddingResponse`), with the `id` and `created` vLLM adds."""
    from orchestrator.core.lines import new_request_id

    return {
        "id": f"embd-{new_request_id()}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": i, "object": "embedding", "embedding": _encode(v) if encoding == "base64" else v}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _encode(vector: list[float]) -> str:
    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def _success(request: EngineRequest, body: dict[str, Any]) -> Any:
    from orchestrator.core.lines import BatchOutputLine, BatchResponse

    return BatchOutputLine(
        custom_id=request.custom_id,
        response=BatchResponse(status_code=200, request_id=body["id"].removeprefix("embd-"), body=body),
    )

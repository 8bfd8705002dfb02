"""vLLM on its pooling runner: `/v1/embeddings` lines answered as OpenAI's embedding list, and
vLLM's `/v1/score` and `/v1/rerank` lines as vLLM's own score and rerank responses.

Each item of a line's `input` is one engine request, and the line is answered once all of its
items are (one `data[]` entry per item, in order). `dimensions` asks a Matryoshka model for a
prefix of its vector (vLLM refuses what the model does not support: an error row). A score or
rerank line embeds its queries and its documents the same way, and scores each pair by the cosine
similarity of their embeddings: what vLLM's bi-encoder scoring does on an embedding model. On a
classifier with one label (a cross-encoder reranker, `*ForSequenceClassification`), each
(query, document) pair is rendered by vLLM's own cross-encoder processor and its score is the
classification, as vLLM's scoring answers; such a model takes no embeddings lines. The body itself
is checked before it gets here (worker/bodies.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engine.vllm_engine import InFlight, VllmEngine, engine_refusal
from worker.outputs import embedding_line, scoring_line
from worker.wire import BadRequest, EngineRequest, RowResult, ScoringInput, error_row


@dataclass
class _Line:
    """An embeddings line whose items are in the engine: the vectors that came back so far."""

    request: EngineRequest
    vectors: list[Any]  # the engine's tensors, None until each comes back
    prompt_tokens: int = 0
    waiting: set[str] = field(default_factory=set)


class VllmEmbeddingEngine(VllmEngine):
    """The vLLM engine on its pooling runner: the same streaming loop, one engine request per input item."""

    name = "vllm"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.vocab_size = self._engine.model_config.get_vocab_size()
        self._lines: dict[str, _Line] = {}
        #: vLLM's cross-encoder renderer when the model classifies (a reranker): score and rerank
        #: lines are then one classification per pair, embeddings lines are refused.
        self._cross_encoder: Any = getattr(self.llm, "pooling_io_processors", {}).get("cross-encoder")

    def abort(self, chunk: str | None = None) -> None:
        super().abort(chunk)
        for key in [k for k, line in self._lines.items() if chunk is None or line.request.chunk == chunk]:
            del self._lines[key]

    def _add(self, request: EngineRequest) -> RowResult | None:
        try:
            lora = self._adapters.for_model(request.model)
            inputs = self._inputs(request, lora)
        except BadRequest as e:
            return error_row(request, e.code, str(e), param=e.param)
        key = str(self._next_id)
        self._next_id += 1
        line = _Line(request, [None] * len(inputs))
        try:
            for i, (prompt, params, length) in enumerate(inputs):
                request_id = f"{key}.{i}"
                self._engine.add_request(request_id, prompt, params, lora_request=lora)
                self._in_flight[request_id] = InFlight(request, length)
                line.waiting.add(request_id)
        except Exception as e:
            refusal = engine_refusal(e)
            self.abort_ids(list(line.waiting))  # the items added before the refused one
            if refusal is None:
                raise  # not about this request: the engine itself is in trouble
            param = refusal[1] or ("dimensions" if "dimension" in refusal[0].lower() else None)
            return error_row(request, "invalid_request", refusal[0], param=param)
        self._lines[key] = line
        return None

    def _inputs(self, request: EngineRequest, lora: Any) -> list[tuple[Any, Any, int]]:
        """(engine prompt, pooling parameters, prompt tokens) for each engine request of the line:
        an embedding per item; for score and rerank, an embedding per text (bi-encoder) or, on a
        classifier, one request per (query, document) pair rendered by vLLM's own cross-encoder."""
        from vllm.pooling_params import PoolingParams

        if request.scoring is not None and self._cross_encoder is not None:
            activation = request.scoring.use_activation
            return [self._pair(query, document, lora, activation) for query, document in _pairs(request.scoring)]
        if request.embedding is not None and self._cross_encoder is None:
            items, dimensions = request.embedding.items, request.embedding.dimensions
        elif request.scoring is not None:
            items, dimensions = (*request.scoring.queries, *request.scoring.documents), None
        elif request.embedding is not None:
            raise BadRequest("unsupported_url", "this model classifies: it answers /v1/score and /v1/rerank lines")
        else:
            raise BadRequest(
                "unsupported_url",
                "this run pools (model.runner: pooling): only /v1/embeddings, /v1/score and /v1/rerank lines",
            )
        prompts = [self._tokens(item, i) for i, item in enumerate(items)]
        params = PoolingParams(task="embed", dimensions=dimensions)
        return [({"prompt_token_ids": ids}, params, len(ids)) for ids in prompts]

    def _pair(self, query: str, document: str, lora: Any, use_activation: bool | None) -> tuple[Any, Any, int]:
        """A (query, document) pair as vLLM's cross-encoder renders it (the model's score template,
        separator token, token type ids...): the engine input and parameters vLLM's scoring sends."""
        from vllm.pooling_params import PoolingParams

        render = {
            "data_1": query,
            "data_2": document,
            "chat_template": None,
            "max_tokens_per_query": 0,
            "max_tokens_per_doc": 0,
            "tok_params": self.llm.renderer.default_cmpl_tok_params,
            "prompt_extras": None,
            "skip_mm_cache": False,
            "params": PoolingParams(task="classify", use_activation=use_activation),
            "lora_requests": lora,
            "priorities": 0,
        }
        try:
            rendered = self._cross_encoder.render(render)
        except ValueError as e:  # too long for the model, or a text it cannot take
            raise BadRequest("invalid_input", str(e), "input") from None
        prompt = rendered["prompts"]
        return prompt, rendered["params"], len(prompt["prompt_token_ids"])

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
        line.vectors[int(position)] = output.outputs.data
        line.prompt_tokens += flight.prompt_tokens
        line.waiting.discard(output.request_id)
        if line.waiting:
            return None
        del self._lines[key]
        request = line.request
        model = request.model if self._adapters.for_model(request.model) is not None else self.model_name
        if request.scoring is not None:
            scores = (
                [v.squeeze().item() for v in line.vectors]  # vLLM's ScoringOutput: the one label's score
                if self._cross_encoder is not None
                else _cosines(request.scoring, line.vectors)
            )
            answer = scoring_line(request, scores, line.prompt_tokens, model or "")
        else:
            answer = embedding_line(request, [v.tolist() for v in line.vectors], line.prompt_tokens, model or "")
        return RowResult(request.index, request.custom_id, answer, line.prompt_tokens, 0, False, request.chunk)


def _pairs(scoring: ScoringInput) -> list[tuple[str, str]]:
    """Each query with its document: one query goes with every document."""
    queries = scoring.queries * len(scoring.documents) if len(scoring.queries) == 1 else scoring.queries
    return list(zip(queries, scoring.documents, strict=True))


def _cosines(scoring: ScoringInput, vectors: list[Any]) -> list[float]:
    """Each pair's score as vLLM's bi-encoder computes it: torch's cosine similarity in float32,
    one query against every document when there is one query."""
    import torch.nn.functional as F

    queries, documents = vectors[: len(scoring.queries)], vectors[len(scoring.queries) :]
    if len(queries) == 1:
        queries = queries * len(documents)
    return [F.cosine_similarity(q.float(), d.float(), dim=0).item() for q, d in zip(queries, documents, strict=True)]

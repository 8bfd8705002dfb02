"""The bodies of the pooling endpoints, checked as vLLM's server checks them: `/v1/embeddings`,
`/v1/score` and `/v1/rerank` (the generation bodies are in worker/bodies.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from worker.bodies import MAX_INPUTS, BaseBody, is_token
from worker.wire import BadRequest, EmbeddingInput, ScoringInput


class EmbeddingBody(BaseBody):
    """A `/v1/embeddings` body: `input` is a string, a list of strings, a list of token ids or a
    list of such lists; `dimensions` asks a Matryoshka model for a prefix of its vector."""

    endpoint: ClassVar[str] = "for embeddings"

    input: Any = None  # checked by `embedding` (its own error code)
    dimensions: int | None = Field(None, ge=1, description="an integer >= 1")
    encoding_format: Literal["float", "base64"] | None = Field(None, description="'float' or 'base64'")

    def embedding(self) -> EmbeddingInput:
        raw = self.input
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(is_token(t) for t in raw)):
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
            elif isinstance(item, list) and item and all(is_token(t) for t in item):
                items.append(tuple(item))
            else:
                raise BadRequest(
                    "invalid_input", f"input[{i}] must be a non-empty string or a non-empty list of token ids", "input"
                )
        return EmbeddingInput(tuple(items), self.dimensions, self.encoding_format or "float")


#: A score or rerank text: a string, or a list of them (vLLM's multimodal content is refused).
Texts = str | list[str]
_TEXTS = "a string or a list of strings"


class _ScoringBody(BaseBody):
    """What score and rerank bodies share (vLLM's ScoringRequestMixin), those orch honours or that
    change nothing in a batch."""

    endpoint: ClassVar[str] = "for score and rerank here"

    #: A cross-encoder's activation; an embedding model's cosine score does not change with it.
    use_activation: bool | None = Field(None, description="true or false")
    priority: int | None = Field(None, description="an integer")  # a batch has no queue to jump
    request_id: str | None = Field(None, description="a string")  # the line's own id is used

    def _scoring(self, first: Texts, second: Texts, top_n: int = 0) -> ScoringInput:
        """vLLM's rule for the two sides: 1:1, 1:N or N:N, and neither empty."""
        queries = [first] if isinstance(first, str) else first
        documents = [second] if isinstance(second, str) else second
        if not queries or not documents:
            raise BadRequest("invalid_input", "At least one text element must be given on each side", "input")
        if len(queries) > 1 and len(queries) != len(documents):
            raise BadRequest(
                "invalid_input",
                f"Input lengths must be either 1:1, 1:N or N:N (got {len(queries)}:{len(documents)})",
                "input",
            )
        return ScoringInput(tuple(queries), tuple(documents), top_n, self.use_activation)


class ScoreBody(_ScoringBody):
    """A `/v1/score` body: one of vLLM's pairs of fields, first side against second."""

    queries: Texts | None = Field(None, description=_TEXTS)
    documents: Texts | None = Field(None, description=_TEXTS)
    items: Texts | None = Field(None, description=_TEXTS)
    data_1: Texts | None = Field(None, description=_TEXTS)
    data_2: Texts | None = Field(None, description=_TEXTS)
    text_1: Texts | None = Field(None, description=_TEXTS)
    text_2: Texts | None = Field(None, description=_TEXTS)

    def scoring(self) -> ScoringInput:
        for first, second in (
            (self.queries, self.documents),
            (self.queries, self.items),
            (self.data_1, self.data_2),
            (self.text_1, self.text_2),
        ):
            if first is not None and second is not None:
                return self._scoring(first, second)
        raise BadRequest(
            "missing_required_parameter",
            "a score body needs queries and documents (or queries and items, data_1 and data_2, text_1 and text_2)",
            "queries",
        )


class RerankBody(_ScoringBody):
    """A `/v1/rerank` body: the documents ranked by their score against the query."""

    query: str | None = Field(None, description="a string")
    documents: Texts | None = Field(None, description=_TEXTS)
    top_n: int = Field(0, ge=0, description="an integer >= 0")

    def scoring(self) -> ScoringInput:
        if self.query is None or self.documents is None:
            missing = "query" if self.query is None else "documents"
            raise BadRequest("missing_required_parameter", f"a rerank body needs {missing}", missing)
        return self._scoring(self.query, self.documents, self.top_n)

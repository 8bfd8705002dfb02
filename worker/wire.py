"""The types a worker passes around: a request line made ready for an engine, and a row's answer.

This module imports nothing of the worker, so every other module may import it and no circle
can form (the `layers` contract in pyproject.toml keeps it at the bottom). What the types mean
on the wire is OpenAI's Batch format (core/lines.py); parsing them is worker/requests.py's job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.core.lines import BatchOutputLine


class BadRequest(ValueError):
    """A request line the worker answers with an error row: `code` and `param` as OpenAI's API names them."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """One constraint on the generated text: `kind` is one of structured.STRUCTURED_KINDS, `value`
    its argument as JSON (a schema, a regex, a list of choices, a grammar, true)."""

    kind: str
    value: str
    #: The body field it came from, for error rows: "response_format" or "structured_outputs".
    source: str

    def vllm_kwargs(self) -> dict[str, Any]:
        return {self.kind: json.loads(self.value)}


@dataclass(frozen=True)
class ToolUse:
    """A row's tools, as JSON text (the request stays hashable), and how it may use them."""

    tools: str
    tool_choice: str  # JSON: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool | None

    @property
    def choice(self) -> Any:
        return json.loads(self.tool_choice)


@dataclass(frozen=True)
class GenerationParams:
    """One request's sampling parameters, defaults applied: what the engines turn into their own."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: no top-k
    n: int
    stop: tuple[str, ...]
    seed: int | None
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    min_tokens: int
    ignore_eos: bool
    #: Top alternatives per generated token: None = no logprobs; 0 = the chosen token's only.
    logprobs: int | None
    echo: bool
    #: A JSON schema, regex, choice or grammar the output must follow (vLLM only).
    constraint: Constraint | None = None
    #: (token id, bias) pairs added to the logits.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's extensions (its SamplingParams' names and defaults).
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop_token_ids: tuple[int, ...] = ()
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None

    def extensions(self) -> list[str]:
        """The vLLM extensions this request sets away from their defaults (those only vLLM honours)."""
        d = GenerationParams.__dataclass_fields__
        names: tuple[str, ...] = ("include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens")
        names += ("stop_token_ids", "bad_words", "allowed_token_ids")
        return [name for name in names if getattr(self, name) != d[name].default]


@dataclass(frozen=True)
class PromptOptions:
    """How a request's prompt is built (vLLM's chat-template and tokenisation extensions)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    #: Extra variables for the chat template, as JSON (the request stays hashable).
    chat_template_kwargs: str = "{}"
    #: None: the endpoint's own (a chat's template writes its special tokens; a prompt gets the tokenizer's).
    add_special_tokens: bool | None = None
    #: Keep this many prompt tokens (-1: as many as the context leaves room for); None: all.
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None


@dataclass(frozen=True)
class EmbeddingInput:
    """An embeddings line's body: one engine request per item, answered together."""

    items: tuple[str | tuple[int, ...], ...]
    dimensions: int | None
    encoding_format: Literal["float", "base64"]


@dataclass(frozen=True)
class ScoringInput:
    """A `/v1/score` or `/v1/rerank` line's texts: each query against its document (one query
    against every document when there is one). On an embedding model a pair's score is the cosine
    similarity of the two embeddings, as vLLM's bi-encoder scoring gives it."""

    queries: tuple[str, ...]
    documents: tuple[str, ...]
    #: Rerank only: the best `top_n` documents (0: all of them).
    top_n: int = 0
    #: A classifier's activation (sigmoid for one label): None is the model's default (on).
    use_activation: bool | None = None


#: Request kinds a pooling run answers (vLLM's pooling runner), never a generating one.
POOLING_KINDS = ("embedding", "score", "rerank")


@dataclass
class EngineRequest:
    """One request line, checked and with its defaults applied: what an engine runs."""

    index: int  # the row's position in its chunk
    custom_id: str
    #: "response": a /v1/responses line, generated as a chat and answered as a Response (worker/responses.py).
    kind: Literal["chat", "completion", "embedding", "score", "rerank", "response"]
    messages: list[dict[str, Any]] | None
    prompt: str | tuple[int, ...] | None  # a completion's text, or its token ids
    params: GenerationParams  # for embeddings, score and rerank: the spec's defaults, unused
    chunk: str | None = None  # set by the worker: where the row's answer goes
    tools: ToolUse | None = None
    #: `body.model`: the engine answers it with the run's model or one of its LoRA adapters.
    model: str | None = None
    embedding: EmbeddingInput | None = None
    scoring: ScoringInput | None = None
    prompt_options: PromptOptions = PromptOptions()
    #: A completion line's prompts when it has several (`prompt` is then the first): n choices each.
    prompts: tuple[str | tuple[int, ...], ...] = ()
    #: Body fields nobody knows, ignored under `requests.unknown_fields: warn` (counted in the summary).
    ignored: tuple[str, ...] = ()
    #: A /v1/responses line's fields the Response object repeats (instructions, tools, text...).
    response: dict[str, Any] | None = None


@dataclass
class RowResult:
    """One request's answer (or error) as its OpenAI Batch output line, with what the worker counts."""

    index: int
    custom_id: str | None
    line: BatchOutputLine
    tokens_in: int
    tokens_out: int
    error: bool
    #: The chunk the request came from (set by the engine from EngineRequest.chunk).
    chunk: str | None = None
    #: Prompt tokens the engine's prefix cache already held (part of tokens_in).
    tokens_cached: int = 0


def error_line(
    custom_id: str | None, code: str, message: str, *, param: str | None = None, status: int = 400
) -> BatchOutputLine:
    """The output line of a row that failed alone: OpenAI's error body, `status` its HTTP code."""
    return BatchOutputLine.error_row(custom_id, code, message, param=param, status=status)


def error_row(request: EngineRequest, code: str, message: str, param: str | None = None) -> RowResult:
    """The request's answer when it fails alone (a template error, a prompt too long, a parameter
    the engine cannot honour): an error line, counted as an error, in the request's chunk."""
    line = error_line(request.custom_id, code, message, param=param)
    return RowResult(request.index, request.custom_id, line, 0, 0, True, request.chunk)

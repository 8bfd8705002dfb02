"""Request bodies per URL as pydantic models: the fields each endpoint takes, their limits, their defaults.

As vLLM's OpenAI server does (`ChatCompletionRequest`, `CompletionRequest`, `EmbeddingRequest`,
`ScoreRequest`, `RerankRequest`),
one model per URL validates a body; a field's `description` is what an error row says it expects,
so the rule checked and the rule told cannot drift. A failed validation becomes one BadRequest:
an unknown field first (`unsupported_parameter`, with the close name it may be a typo of), else
the first field in error (`invalid_parameter`), each naming the field; `problems` lists them all
(what `orch prepare` reports before anything runs). Fields that change nothing in a batch (user,
metadata, stream...) are accepted and unused. Strict models: `true` is not a valid `n`, `1` not
a valid `logprobs` flag, `"0.5"` not a temperature (an integer is a valid number).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.spec import SamplingSpec
from worker.responses import response_format
from worker.structured import StructuredError, constraint, logit_bias
from worker.wire import BadRequest, Constraint, GenerationParams, PromptOptions

#: The range vLLM's OpenAI server accepts for `seed` (int64); a larger seed fails inside the engine step.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Below this temperature sampling is greedy (vLLM's own threshold).
GREEDY_BELOW = 1e-5
#: OpenAI's limit on inputs per embeddings request.
MAX_INPUTS = 2048

#: OpenAI's defaults for what neither the body, the spec nor the model's generation_config.json
#: sets (vLLM's `ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS`).
OPENAI_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}

B = TypeVar("B", bound="BaseBody")
NonEmptyText = Annotated[str, Field(min_length=1)]


class BaseBody(BaseModel):
    """What every body may carry; unknown fields are refused, each field's type held strictly."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    #: How an error row names the endpoint of an unknown field.
    endpoint: ClassVar[str] = "in a batch here"

    #: The engine answers it with the run's model or one of its LoRA adapters (a non-string: the run's model).
    model: Any = None
    user: Any = None  # changes nothing here

    #: vLLM's extensions that orch does not honour: accepted at these values only (their defaults).
    neutral: ClassVar[dict[str, tuple[Any, ...]]] = {}

    @classmethod
    def parse(cls: type[B], body: dict[str, Any]) -> B:
        """The body as this model; a BadRequest naming the field when it is not one (an unknown field first)."""
        try:
            parsed = cls.model_validate(body)
        except ValidationError as e:
            raise cls._bad_requests(e, body)[0] from None
        neutral = cls._not_neutral(body)
        if neutral:
            raise neutral[0]
        return parsed

    @classmethod
    def problems(cls, body: dict[str, Any]) -> list[BadRequest]:
        """Every field of the body this model refuses, unknown fields first: what `parse` raises the first of."""
        try:
            cls.model_validate(body)
        except ValidationError as e:
            return cls._bad_requests(e, body)
        return cls._not_neutral(body)

    @classmethod
    def _not_neutral(cls, body: dict[str, Any]) -> list[BadRequest]:
        return [
            BadRequest(
                "unsupported_parameter",
                f"{name}={body[name]!r}: orch does not honour this vLLM extension (only {values[0]!r})",
                name,
            )
            for name, values in cls.neutral.items()
            if body.get(name) not in values
        ]

    @classmethod
    def unknown(cls, body: dict[str, Any]) -> tuple[str, ...]:
        """The body's fields this endpoint does not know."""
        return tuple(name for name in body if name not in cls.model_fields)

    @classmethod
    def _bad_requests(cls, error: ValidationError, body: dict[str, Any]) -> list[BadRequest]:
        """One BadRequest per field in error (pydantic may report a field once per type of a union), unknown first."""
        unknown: list[BadRequest] = []
        invalid: dict[str, BadRequest] = {}
        for problem in error.errors():
            name = str(problem["loc"][0])
            if problem["type"] == "extra_forbidden":
                close = difflib.get_close_matches(name, list(cls.model_fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                message = f"parameter {name!r} is not supported {cls.endpoint}{hint}"
                unknown.append(BadRequest("unsupported_parameter", message, name))
            elif name not in invalid:
                expected = cls.model_fields[name].description
                message = f"{name}={body.get(name)!r}: expected {expected}"
                invalid[name] = BadRequest("invalid_parameter", message, name)
        return [*unknown, *invalid.values()]


class _SamplingBody(BaseBody):
    """What chat and completion bodies share: sampling, penalties, constraints."""

    # OpenAI fields that do not change what is generated, in a batch.
    metadata: Any = None
    store: Any = None
    stream: Any = None
    stream_options: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None

    max_tokens: int | None = Field(None, ge=1, description="an integer >= 1")
    temperature: float | None = Field(None, ge=0, le=2, description="a number from 0 to 2")
    top_p: float | None = Field(None, gt=0, le=1, description="a number in (0, 1]")
    n: int | None = Field(None, ge=1, le=128, description="an integer from 1 to 128")
    stop: NonEmptyText | list[NonEmptyText] | None = Field(None, description="a string or a list of non-empty strings")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="an integer from -2**63 to 2**63-1")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="-2 to 2")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="-2 to 2")
    # vLLM's extensions, accepted by its OpenAI server too.
    top_k: int | None = Field(None, ge=-1, description="an integer >= -1")
    min_p: float | None = Field(None, ge=0, le=1, description="a number from 0 to 1")
    repetition_penalty: float | None = Field(None, gt=0, description="a number > 0")
    min_tokens: int | None = Field(None, ge=0, description="0 to max_tokens")
    ignore_eos: bool | None = Field(None, description="true or false")
    # Constrained decoding (worker/structured.py); vLLM's server takes both on both endpoints.
    response_format: Any = None
    structured_outputs: Any = None
    logit_bias: Any = None
    include_stop_str_in_output: bool | None = Field(None, description="true or false")
    skip_special_tokens: bool | None = Field(None, description="true or false")
    spaces_between_special_tokens: bool | None = Field(None, description="true or false")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="a list of token ids")
    bad_words: list[NonEmptyText] | None = Field(None, description="a list of non-empty strings")
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="a list of token ids")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, description="an integer >= -1")
    truncation_side: Literal["left", "right"] | None = Field(None, description="'left' or 'right'")
    add_special_tokens: bool | None = Field(None, description="true or false")
    # vLLM's extensions that change nothing in a batch (scheduling, caching, transfer).
    priority: Any = None
    request_id: Any = None
    session_id: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    stream_interval: Any = None
    # vLLM's extensions orch does not honour: accepted at their defaults only (`neutral`).
    use_beam_search: Any = None
    length_penalty: Any = None
    watermarking: Any = None
    prompt_logprobs: Any = None
    logprob_token_ids: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    return_token_offsets: Any = None
    return_prompt_text: Any = None
    vllm_xargs: Any = None
    repetition_detection: Any = None

    neutral: ClassVar[dict[str, tuple[Any, ...]]] = {
        "use_beam_search": (False, None),
        "length_penalty": (1.0, 1, None),
        "watermarking": (False, None),
        "prompt_logprobs": (None,),
        "logprob_token_ids": (None,),
        "return_tokens_as_token_ids": (False, None),
        "return_token_ids": (False, None),
        "return_token_offsets": (False, None),
        "return_prompt_text": (False, None),
        "vllm_xargs": (None,),
        "repetition_detection": (None,),
    }

    def params(self, defaults: SamplingSpec) -> GenerationParams:
        """The request's parameters: the body's, else the spec's `sampling`, else vLLM's defaults."""
        d = defaults
        n = self.n if self.n is not None else d.n
        max_tokens = self._max_tokens() or d.max_tokens
        temperature = _first(self.temperature, d.temperature, OPENAI_DEFAULTS["temperature"])
        if n > 1 and temperature < GREEDY_BELOW:
            # vLLM's server refuses this too: greedy decoding gives n identical copies.
            raise BadRequest(
                "invalid_parameter",
                f"n must be 1 when using greedy sampling, got {n} (temperature is {temperature:g}; "
                "set a temperature > 0 for n samples)",
                "n",
            )
        min_tokens = self.min_tokens or 0
        if min_tokens > max_tokens:
            raise BadRequest("invalid_parameter", f"min_tokens={min_tokens!r}: expected 0 to max_tokens", "min_tokens")
        stop = (self.stop if "stop" in self.model_fields_set else d.stop) or ()
        top_k = self.top_k if self.top_k is not None else (d.top_k if d.top_k is not None else 0)
        logprobs, echo = self._logprobs_echo()
        constrained, bias = self._constraints()
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=_first(self.top_p, d.top_p, OPENAI_DEFAULTS["top_p"]),
            top_k=max(top_k, 0),
            n=n,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=self.seed if self.seed is not None else d.seed,
            presence_penalty=_first(self.presence_penalty, d.presence_penalty, 0.0),
            frequency_penalty=_first(self.frequency_penalty, d.frequency_penalty, 0.0),
            repetition_penalty=_first(self.repetition_penalty, d.repetition_penalty, 1.0),
            min_p=_first(self.min_p, d.min_p, OPENAI_DEFAULTS["min_p"]),
            min_tokens=min_tokens,
            ignore_eos=bool(self.ignore_eos),
            logprobs=logprobs,
            echo=echo,
            constraint=constrained,
            logit_bias=bias,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            skip_special_tokens=self.skip_special_tokens is not False,
            spaces_between_special_tokens=self.spaces_between_special_tokens is not False,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            bad_words=tuple(self.bad_words or ()),
            allowed_token_ids=tuple(self.allowed_token_ids) if self.allowed_token_ids is not None else None,
        )

    def prompt_options(self) -> PromptOptions:
        """How the prompt is built: the body's tokenisation (and, for chat, template) extensions."""
        return PromptOptions(
            add_special_tokens=self.add_special_tokens,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            truncation_side=self.truncation_side,
        )

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def _logprobs_echo(self) -> tuple[int | None, bool]:
        """(logprobs, echo) as the endpoint spells them."""
        raise NotImplementedError

    def _constraints(self) -> tuple[Constraint | None, tuple[tuple[int, float], ...]]:
        body = {"response_format": self._response_format(), "structured_outputs": self.structured_outputs}
        try:
            return constraint(body), logit_bias(self.logit_bias)
        except StructuredError as e:
            raise BadRequest("invalid_parameter", str(e), e.param) from None

    def _response_format(self) -> Any:
        return self.response_format


class ChatBody(_SamplingBody):
    """A `/v1/chat/completions` body."""

    messages: Any = None  # checked in worker/requests.py (its own error codes)
    max_completion_tokens: int | None = Field(None, ge=1, description="an integer >= 1")
    logprobs: bool | None = Field(None, description="true or false")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="an integer from 0 to 20")
    # Tool calling (worker/tools.py).
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # vLLM's chat-template extensions.
    add_generation_prompt: bool | None = Field(None, description="true or false")
    continue_final_message: bool | None = Field(None, description="true or false")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="an object")
    documents: list[dict[str, str]] | None = Field(None, description="a list of objects of strings")
    # vLLM's chat extensions orch does not honour: accepted at their defaults only.
    echo: Any = None
    chat_template: Any = None  # vLLM's server refuses it too, unless started with --trust-request-chat-template
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None
    thinking_token_budget: Any = None

    neutral: ClassVar[dict[str, tuple[Any, ...]]] = {
        **_SamplingBody.neutral,
        "echo": (False, None),
        "chat_template": (None,),
        "mm_processor_kwargs": (None,),
        "media_io_kwargs": (None,),
        "thinking_token_budget": (None,),
    }

    def prompt_options(self) -> PromptOptions:
        if self.add_generation_prompt and self.continue_final_message:
            # vLLM's server refuses this pair too.
            raise BadRequest(
                "invalid_parameter",
                "continue_final_message and add_generation_prompt cannot both be true",
                "continue_final_message",
            )
        kwargs = dict(self.chat_template_kwargs or {})
        if self.documents is not None:
            kwargs["documents"] = self.documents
        return replace(
            super().prompt_options(),
            add_generation_prompt=self.add_generation_prompt is not False and not self.continue_final_message,
            continue_final_message=bool(self.continue_final_message),
            chat_template_kwargs=json.dumps(kwargs, sort_keys=True),
        )

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if "max_completion_tokens" in self.model_fields_set else self.max_tokens

    def _logprobs_echo(self) -> tuple[int | None, bool]:
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest("invalid_parameter", "top_logprobs needs logprobs: true", "top_logprobs")
        return ((self.top_logprobs or 0) if self.logprobs else None), False


class CompletionBody(_SamplingBody):
    """A `/v1/completions` body."""

    prompt: Any = None  # checked in worker/requests.py (its own error code)
    logprobs: int | None = Field(None, ge=0, le=20, description="an integer from 0 to 20")
    echo: bool | None = Field(None, description="true or false")
    best_of: int | None = Field(None, ge=1, description="an integer >= 1")

    def params(self, defaults: SamplingSpec) -> GenerationParams:
        params = super().params(defaults)
        if self.best_of is not None and self.best_of != params.n:
            raise BadRequest(
                "unsupported_parameter", "best_of different from n is not supported (vLLM dropped it)", "best_of"
            )
        return params

    def _logprobs_echo(self) -> tuple[int | None, bool]:
        return self.logprobs, bool(self.echo)


class ResponsesBody(_SamplingBody):
    """A `/v1/responses` body (worker/responses.py turns it into a chat). `reasoning` is accepted and
    repeated in the answer, not honoured (the chat template gets no effort); `store` changes nothing."""

    endpoint: ClassVar[str] = "for /v1/responses"
    #: Fields of the chat endpoints a Responses body spells otherwise (`max_output_tokens`, `text.format`).
    _NOT_HERE: ClassVar[tuple[str, ...]] = ("n", "max_tokens", "response_format")

    input: Any = None  # checked in worker/responses.py (its own error code)
    instructions: str | None = Field(None, description="a string")
    max_output_tokens: int | None = Field(None, ge=1, description="an integer >= 1")
    text: dict[str, Any] | None = Field(None, description='an object such as {"format": {"type": "json_schema", ...}}')
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = Field(None, description="true or false")
    reasoning: dict[str, Any] | None = Field(None, description='an object such as {"effort": "low"}')
    truncation: Literal["disabled"] | None = Field(None, description="'disabled' (the prompt is never cut here)")
    include: list[str] | None = Field(None, max_length=0, description="an empty list (no extra output here)")
    background: Literal[False] | None = Field(None, description="false (a batch line has no background mode)")
    previous_response_id: None = Field(None, description="null: no response is stored here, send the input whole")

    def params(self, defaults: SamplingSpec) -> GenerationParams:
        for name in self._NOT_HERE:
            if name in self.model_fields_set:
                raise BadRequest("unsupported_parameter", f"parameter {name!r} is not supported {self.endpoint}", name)
        return super().params(defaults)

    def _max_tokens(self) -> int | None:
        return self.max_output_tokens

    def _logprobs_echo(self) -> tuple[int | None, bool]:
        return None, False

    def _response_format(self) -> Any:
        return response_format(self.text)

    def echo(self) -> dict[str, Any]:
        """The request fields a `Response` repeats, with OpenAI's values when a field was not given."""
        return {
            "instructions": self.instructions,
            "metadata": self.metadata,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "tools": self.tools or [],
            "tool_choice": self.tool_choice if self.tool_choice is not None else "auto",
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "text": self.text or {"format": {"type": "text"}},
            "reasoning": self.reasoning,
            "truncation": "disabled",
        }


def with_model_defaults(spec: SamplingSpec, model: dict[str, Any]) -> SamplingSpec:
    """The spec's sampling defaults, what it leaves unset taken from the model's own
    (`generation_config.json` as vLLM reads it: `ModelConfig.get_diff_sampling_param`). A body's
    field wins over both; OpenAI's defaults come last (`_SamplingBody.params`)."""
    update: dict[str, Any] = {}
    for name in OPENAI_DEFAULTS:
        if getattr(spec, name) is None and model.get(name) is not None:
            update[name] = int(model[name]) if name == "top_k" else float(model[name])
    return spec.model_copy(update=update)


def _first(given: float | None, default: float | None, fallback: float) -> float:
    return given if given is not None else (default if default is not None else fallback)


def is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

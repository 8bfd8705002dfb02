"""Canonical request lines (OpenAI Batch format) into engine requests, with each row's own parameters.

A line's body sets its own sampling parameters; the spec's `sampling` section fills in the rest.
Parameters that would change a generation but that we cannot honour give an error row naming
them: never a silently different answer. Parameters that change nothing here (user, metadata,
stream...) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.core.spec import SamplingSpec
from worker.engine.base import RowResult
from worker.outputs import error_line
from worker.structured import Constraint, StructuredError, constraint, logit_bias
from worker.tools import ToolError, ToolUse, tool_use

if TYPE_CHECKING:
    from worker.embeddings import EmbeddingInput

CHAT_URL = "/v1/chat/completions"
COMPLETION_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"

#: The range vLLM's OpenAI server accepts for `seed` (int64); a larger seed fails inside the engine step.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Below this temperature sampling is greedy (vLLM's own threshold).
GREEDY_BELOW = 1e-5

#: OpenAI fields that do not change what is generated, in a batch.
_IGNORED = {
    "model",
    "user",
    "metadata",
    "store",
    "stream",
    "stream_options",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
}
#: Fields we honour, per endpoint.
_COMMON = {
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    # vLLM's extensions, accepted by its OpenAI server too.
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    # Constrained decoding (worker/structured.py); vLLM's server takes both on both endpoints.
    "response_format",
    "structured_outputs",
    "logit_bias",
}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    # Tool calling (worker/tools.py).
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
_COMPLETION = _COMMON | {"prompt", "logprobs", "echo", "best_of"}


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


@dataclass
class EngineRequest:
    index: int  # the row's position in its chunk
    custom_id: str
    kind: Literal["chat", "completion", "embedding"]
    messages: list[dict[str, Any]] | None
    prompt: str | None
    params: GenerationParams  # for embeddings: the spec's defaults, unused
    chunk: str | None = None  # set by the worker: where the row's answer goes
    tools: ToolUse | None = None
    #: `body.model`: the engine answers it with the run's model or one of its LoRA adapters.
    model: str | None = None
    embedding: EmbeddingInput | None = None


class BadRequest(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


def parse_request(line: bytes | str, index: int, defaults: SamplingSpec) -> EngineRequest | RowResult:
    """An engine request, or an error row when the line cannot become one."""
    custom_id: str | None = None
    try:
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise BadRequest("invalid_json", f"line {index + 1} of the chunk is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise BadRequest("invalid_request", "a request line is a JSON object")
        custom_id = obj.get("custom_id") if isinstance(obj.get("custom_id"), str) else None
        if custom_id is None:
            raise BadRequest("missing_custom_id", "the request has no custom_id string", "custom_id")
        url, body = obj.get("url"), obj.get("body")
        if not isinstance(body, dict):
            raise BadRequest("invalid_request", "the request has no body object", "body")
        model = body.get("model") if isinstance(body.get("model"), str) else None
        if url == CHAT_URL:
            _check_keys(body, _CHAT)
            params = _params(body, defaults, chat=True)
            messages = _messages(body)
            return EngineRequest(index, custom_id, "chat", messages, None, params, tools=_tools(body), model=model)
        if url == COMPLETION_URL:
            _check_keys(body, _COMPLETION)
            params = _params(body, defaults, chat=False)
            return EngineRequest(index, custom_id, "completion", None, _prompt(body), params, model=model)
        if url == EMBEDDINGS_URL:
            from worker.embeddings import parse_embedding_body  # it imports this module

            embedding = parse_embedding_body(body)
            params = _params({}, defaults, chat=False)
            return EngineRequest(index, custom_id, "embedding", None, None, params, model=model, embedding=embedding)
        raise BadRequest(
            "unsupported_url", f"url {url!r} is not {CHAT_URL}, {COMPLETION_URL} or {EMBEDDINGS_URL}", "url"
        )
    except BadRequest as e:
        return RowResult(index, custom_id, error_line(custom_id, e.code, str(e), param=e.param), 0, 0, True)


def for_template(messages: list[dict[str, Any]], template: str | None) -> list[dict[str, Any]]:
    """The messages as a chat template sees them: like vLLM's server, a template that knows no
    `developer` role gets those messages as `system`, merged into one system message first."""
    if template and ("'developer'" in template or '"developer"' in template):
        return messages
    if not any(m["role"] == "developer" for m in messages):
        return messages
    mapped = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    systems = [m for m in mapped if m["role"] == "system"]
    if len(systems) == 1 and mapped[0]["role"] == "system":
        return mapped
    merged = {"role": "system", "content": "\n\n".join(m["content"] for m in systems if m["content"])}
    return [merged, *(m for m in mapped if m["role"] != "system")]


def _check_keys(body: dict[str, Any], allowed: set[str]) -> None:
    for key in body:
        if key not in allowed and key not in _IGNORED:
            raise BadRequest("unsupported_parameter", f"parameter {key!r} is not supported in a batch here", key)


def _constraints(body: dict[str, Any]) -> tuple[Constraint | None, tuple[tuple[int, float], ...]]:
    try:
        return constraint(body), logit_bias(body.get("logit_bias"))
    except StructuredError as e:
        raise BadRequest("invalid_parameter", str(e), e.param) from None


def _tools(body: dict[str, Any]) -> ToolUse | None:
    try:
        return tool_use(body)
    except ToolError as e:
        raise BadRequest("invalid_parameter", str(e), e.param) from None


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("invalid_messages", "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("invalid_messages", f"messages[{i}] needs a role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url", ...}]
            from worker.images import content_parts  # it imports this module

            content = content_parts(content, i)
        # An assistant turn that called tools may have no content; the calls and the tool answers'
        # ids go to the chat template as they are.
        kept = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}
        if content is None and "tool_calls" in kept:
            content = ""
        if not isinstance(content, (str, list)):
            raise BadRequest("invalid_messages", f"messages[{i}].content must be text", "messages")
        out.append({"role": m["role"], "content": content, **kept})
    return out


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("invalid_prompt", "prompt must be a string (or a list of one string)", "prompt")
    return prompt


def _params(body: dict[str, Any], d: SamplingSpec, *, chat: bool) -> GenerationParams:
    def get(name: str, kind: type, default: Any, check=lambda _value: True, rule: str = "") -> Any:
        value = body.get(name)
        if value is None:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # bool is an int in Python: `true` is not a valid n, and 1 is not a valid logprobs flag.
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool) or not check(value):
            raise BadRequest("invalid_parameter", f"{name}={value!r}: expected {rule or kind.__name__}", name)
        return value

    n = get("n", int, d.n, lambda v: 1 <= v <= 128, "an integer from 1 to 128")
    max_tokens = get(
        "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
        int,
        d.max_tokens,
        lambda v: v >= 1,
        "an integer >= 1",
    )
    stop = body.get("stop", d.stop)
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("invalid_parameter", "stop must be a string or a list of non-empty strings", "stop")
    if chat:
        wants = get("logprobs", bool, False)
        top = get("top_logprobs", int, None, lambda v: 0 <= v <= 20, "an integer from 0 to 20")
        if top is not None and not wants:
            raise BadRequest("invalid_parameter", "top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (top or 0) if wants else None
        echo = False
    else:
        logprobs = get("logprobs", int, None, lambda v: 0 <= v <= 20, "an integer from 0 to 20")
        echo = get("echo", bool, False)
        best_of = get("best_of", int, n, lambda v: v >= 1, "an integer >= 1")
        if best_of != n:
            raise BadRequest(
                "unsupported_parameter", "best_of different from n is not supported (vLLM dropped it)", "best_of"
            )
        if echo and logprobs is not None:
            raise BadRequest("unsupported_parameter", "echo with logprobs (prompt logprobs) is not supported", "echo")
    top_k = get("top_k", int, d.top_k if d.top_k is not None else 0, lambda v: v >= -1, "an integer >= -1")
    temperature = get("temperature", float, d.temperature, lambda v: 0 <= v <= 2, "a number from 0 to 2")
    if n > 1 and temperature < GREEDY_BELOW:
        # vLLM's server refuses this too: greedy decoding gives n identical copies.
        raise BadRequest(
            "invalid_parameter",
            f"n must be 1 when using greedy sampling, got {n} (temperature is {temperature:g}; orch's default is 0, "
            "set a temperature > 0 for n samples)",
            "n",
        )
    constrained, bias = _constraints(body)
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=get("top_p", float, d.top_p, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        top_k=max(top_k, 0),
        n=n,
        stop=tuple(stop or ()),
        seed=get("seed", int, d.seed, lambda v: INT64_MIN <= v <= INT64_MAX, "an integer from -2**63 to 2**63-1"),
        presence_penalty=get("presence_penalty", float, d.presence_penalty or 0.0, lambda v: -2 <= v <= 2, "-2 to 2"),
        frequency_penalty=get(
            "frequency_penalty", float, d.frequency_penalty or 0.0, lambda v: -2 <= v <= 2, "-2 to 2"
        ),
        repetition_penalty=get(
            "repetition_penalty", float, d.repetition_penalty or 1.0, lambda v: v > 0, "a number > 0"
        ),
        min_p=get("min_p", float, 0.0, lambda v: 0 <= v <= 1, "a number from 0 to 1"),
        min_tokens=get("min_tokens", int, 0, lambda v: 0 <= v <= max_tokens, "0 to max_tokens"),
        ignore_eos=get("ignore_eos", bool, False),
        logprobs=logprobs,
        echo=echo,
        constraint=constrained,
        logit_bias=bias,
    )

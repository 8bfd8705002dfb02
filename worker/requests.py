"""Canonical request lines (OpenAI Batch format) into engine requests, with each row's own parameters.

A line's body is validated by its URL's model (worker/bodies.py); the spec's `sampling` section
fills in what the body does not set, and a reference to the run's JSON schema (what prepare
writes in place of `--json-schema`'s schema: core/json_schema.RunSchemas) becomes the schema.
Parameters that would change a generation but that we cannot honour give an error row naming
them: never a silently different answer. Parameters that change nothing here (user, metadata,
stream...) are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core.request.json_schema import RunSchemas, SchemaProblem
from orchestrator.core.spec import SamplingSpec
from worker.bodies import ChatBody, CompletionBody, ResponsesBody, is_token
from worker.images import content_parts
from worker.pooling_bodies import EmbeddingBody, RerankBody, ScoreBody
from worker.responses import chat_tools, input_messages
from worker.tools import ToolError, tool_use
from worker.wire import BadRequest, EngineRequest, RowResult, ToolUse, error_line

CHAT_URL = "/v1/chat/completions"
COMPLETION_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
SCORE_URL = "/v1/score"
RERANK_URL = "/v1/rerank"
RESPONSES_URL = "/v1/responses"
URLS = (CHAT_URL, COMPLETION_URL, RESPONSES_URL, EMBEDDINGS_URL, SCORE_URL, RERANK_URL)
#: A line read without the run's schemas: a reference in it names no schema.
_NO_SCHEMAS = RunSchemas()


def parse_request(
    line: bytes | str,
    index: int,
    defaults: SamplingSpec,
    unknown_fields: str = "error",
    schemas: RunSchemas | None = None,
) -> EngineRequest | RowResult:
    """An engine request, or an error row when the line cannot become one. `unknown_fields`
    (the spec's `requests.unknown_fields`): "error" refuses a body field no endpoint knows;
    "warn" drops it, as vLLM's server does, and names it in `EngineRequest.ignored`. `schemas`:
    the run's stored schemas, which a line's schema reference names."""
    custom_id: str | None = None
    try:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise BadRequest("invalid_json", f"line {index + 1} of the chunk is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise BadRequest("invalid_request", "a request line is a JSON object")
        custom_id = obj.get("custom_id") if isinstance(obj.get("custom_id"), str) else None
        if custom_id is None:
            raise BadRequest("missing_custom_id", "the request has no custom_id string", "custom_id")
        body = obj.get("body")
        if not isinstance(body, dict):
            raise BadRequest("invalid_request", "the request has no body object", "body")
        body = _resolved(body, schemas)
        return _engine_request(obj.get("url"), body, index, custom_id, defaults, unknown_fields == "warn")
    except BadRequest as e:
        return RowResult(index, custom_id, error_line(custom_id, e.code, str(e), param=e.param), 0, 0, True)


#: The body field holding a line's own text, by URL: checked on every line by `content_problem`,
#: while the rest of a body (its parameters) is often the same on many lines and checked once.
CONTENT_FIELDS = {CHAT_URL: "messages", COMPLETION_URL: "prompt"}
_BODIES: dict[str, type[ChatBody | CompletionBody | ResponsesBody | EmbeddingBody | ScoreBody | RerankBody]] = {
    CHAT_URL: ChatBody,
    COMPLETION_URL: CompletionBody,
    RESPONSES_URL: ResponsesBody,
    EMBEDDINGS_URL: EmbeddingBody,
    SCORE_URL: ScoreBody,
    RERANK_URL: RerankBody,
}


def body_problems(
    url: Any,
    body: dict[str, Any],
    defaults: SamplingSpec,
    unknown_fields: str = "error",
    schemas: RunSchemas | None = None,
) -> list[BadRequest]:
    """Every reason `parse_request` would answer this body with an error row: each field its model
    refuses, or else the first rule beyond single fields it breaks (n with greedy sampling, a
    constraint, tools, the content). Engine-free: `orch prepare` checks every line with it."""
    model = _BODIES.get(url)
    if model is None:
        return [BadRequest("unsupported_url", f"url {url!r} is not one of {', '.join(URLS)}", "url")]
    warn = unknown_fields == "warn"
    try:
        body = _resolved(body, schemas)
    except BadRequest as e:
        return [e]
    problems = model.problems(_without(body, model.unknown(body)) if warn else body)
    if problems:
        return problems
    try:
        _engine_request(url, body, 0, "", defaults, warn)
    except BadRequest as e:
        return [e]
    return []


def _resolved(body: dict[str, Any], schemas: RunSchemas | None) -> dict[str, Any]:
    """The body with the run's schema in place of its reference (RunSchemas.resolved)."""
    try:
        return (schemas or _NO_SCHEMAS).resolved(body)
    except SchemaProblem as e:
        raise BadRequest("invalid_parameter", f"response_format: {e}", "response_format") from None


def content_problem(url: str, value: Any) -> BadRequest | None:
    """What is wrong with a line's `CONTENT_FIELDS` value (its messages, its prompt), if anything."""
    try:
        if url == CHAT_URL:
            _messages(value)
        elif url == COMPLETION_URL:
            _prompts(value)
    except BadRequest as e:
        return e
    return None


def _engine_request(
    url: Any, body: dict[str, Any], index: int, custom_id: str, defaults: SamplingSpec, warn: bool
) -> EngineRequest:
    model = body.get("model") if isinstance(body.get("model"), str) else None
    if url == CHAT_URL:
        ignored = ChatBody.unknown(body) if warn else ()
        chat = ChatBody.parse(_without(body, ignored))
        params, options = chat.params(defaults), chat.prompt_options()
        messages = _messages(chat.messages)
        tools = _tools(body)
        return EngineRequest(
            index,
            custom_id,
            "chat",
            messages,
            None,
            params,
            tools=tools,
            model=model,
            prompt_options=options,
            ignored=ignored,
        )
    if url == COMPLETION_URL:
        ignored = CompletionBody.unknown(body) if warn else ()
        completion = CompletionBody.parse(_without(body, ignored))
        params, options = completion.params(defaults), completion.prompt_options()
        prompts = _prompts(completion.prompt)
        return EngineRequest(
            index,
            custom_id,
            "completion",
            None,
            prompts[0],
            params,
            model=model,
            prompt_options=options,
            ignored=ignored,
            prompts=prompts if len(prompts) > 1 else (),
        )
    if url == EMBEDDINGS_URL:
        embedding = EmbeddingBody.parse(body).embedding()
        params = CompletionBody().params(defaults)
        return EngineRequest(index, custom_id, "embedding", None, None, params, model=model, embedding=embedding)
    if url in (SCORE_URL, RERANK_URL):  # vLLM's scoring endpoints
        params = CompletionBody().params(defaults)
        if url == SCORE_URL:
            scoring = ScoreBody.parse(body).scoring()
            return EngineRequest(index, custom_id, "score", None, None, params, model=model, scoring=scoring)
        scoring = RerankBody.parse(body).scoring()
        return EngineRequest(index, custom_id, "rerank", None, None, params, model=model, scoring=scoring)
    if url == RESPONSES_URL:
        return _responses_request(body, index, custom_id, defaults, model, warn)
    raise BadRequest("unsupported_url", f"url {url!r} is not one of {', '.join(URLS)}", "url")


def _without(body: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in names} if names else body


def _responses_request(
    body: dict[str, Any], index: int, custom_id: str, defaults: SamplingSpec, model: str | None, warn: bool
) -> EngineRequest:
    """A /v1/responses line as the chat it is generated as, with what its Response repeats."""
    ignored = ResponsesBody.unknown(body) if warn else ()
    parsed = ResponsesBody.parse(_without(body, ignored))
    params = parsed.params(defaults)
    messages = _messages(input_messages(parsed.instructions, parsed.input))
    tools, choice = chat_tools(parsed.tools, parsed.tool_choice)
    use = _tools({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parsed.parallel_tool_calls})
    return EngineRequest(
        index,
        custom_id,
        "response",
        messages,
        None,
        params,
        tools=use,
        model=model,
        response=parsed.echo(),
        ignored=ignored,
    )


def _tools(body: dict[str, Any]) -> ToolUse | None:
    try:
        return tool_use(body)
    except ToolError as e:
        raise BadRequest("invalid_parameter", str(e), e.param) from None


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("invalid_messages", "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("invalid_messages", f"messages[{i}] needs a role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url", ...}]
            content = content_parts(content, i)
        # An assistant turn that called tools may have no content; the calls and the tool answers'
        # ids go to the chat template as they are.
        kept = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if m.get(k) is not None}
        if m["role"] == "assistant" and "tool_calls" in kept:
            _check_tool_calls(kept["tool_calls"], i)
        if content is None and "tool_calls" in kept:
            content = ""
        if not isinstance(content, (str, list)):
            raise BadRequest("invalid_messages", f"messages[{i}].content must be text", "messages")
        out.append({"role": m["role"], "content": content, **kept})
    return out


def _check_tool_calls(calls: Any, i: int) -> None:
    """An assistant turn's `tool_calls`: function calls only, each with its `function` object (as
    vLLM's server requires before it reads their arguments for the chat template)."""
    if not isinstance(calls, list):
        raise BadRequest("invalid_messages", f"messages[{i}].tool_calls must be a list", "messages")
    for j, call in enumerate(calls):
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise BadRequest(
                "invalid_messages", f"messages[{i}].tool_calls[{j}] must be an object of type 'function'", "messages"
            )
        if not isinstance(call.get("function"), dict):
            raise BadRequest(
                "invalid_messages", f"messages[{i}].tool_calls[{j}].function must be an object", "messages"
            )


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """A completion's prompts: a string or a list of token ids is one; a list of either is several."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(is_token(t) for t in prompt)):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt:
        texts = [p for p in prompt if isinstance(p, str)]
        ids = [tuple(p) for p in prompt if isinstance(p, list) and p and all(is_token(t) for t in p)]
        if len(texts) == len(prompt) or len(ids) == len(prompt):
            return tuple(texts) or tuple(ids)
    raise BadRequest(
        "invalid_prompt",
        "prompt must be a string, a list of token ids, or a non-empty list of strings or of token id lists",
        "prompt",
    )

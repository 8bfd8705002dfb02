"""Output lines checked against the official `openai` SDK's types: what OpenAI's own clients will parse."""

from __future__ import annotations

from typing import Any

#: The SDK type of each success body, by its `object` field.
BODY_TYPES = {
    "chat.completion": ("openai.types.chat", "ChatCompletion"),
    "text_completion": ("openai.types", "Completion"),
    "list": ("openai.types", "CreateEmbeddingResponse"),
    "response": ("openai.types.responses", "Response"),
}
#: vLLM's extensions a body may carry beyond the SDK's fields: a reasoning model's `message.reasoning`.
VLLM_EXTRAS = {"reasoning"}


def check_line(line: dict[str, Any]) -> Any:
    """The line's body as the SDK's object (a success) or `BatchError` (an error row); raises
    pydantic's ValidationError when the SDK would not read it."""
    import importlib

    from openai.types import BatchError

    assert set(line) >= {"id", "custom_id", "response", "error"}, line
    if line["error"] is not None:
        error = BatchError.model_validate(line["error"])
        assert error.code and error.message, line
        return error
    body = line["response"]["body"]
    if body["object"] == "text_completion":
        body = _first_echoed_token_typed(body)
    module, name = BODY_TYPES[body["object"]]
    sdk_type = getattr(importlib.import_module(module), name)
    parsed = sdk_type.model_validate(body)
    # The SDK's models allow extra keys: a misspelt field would pass unseen, so none may be extra.
    assert not _extras(parsed), (name, _extras(parsed))
    return parsed


def _extras(model: Any) -> list[str]:
    from pydantic import BaseModel

    found = list(set(model.model_extra or {}) - VLLM_EXTRAS) if isinstance(model, BaseModel) else []
    if isinstance(model, BaseModel):
        for value in model.__dict__.values():
            for item in value if isinstance(value, list) else [value]:
                found += _extras(item)
    return found


def _first_echoed_token_typed(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's API (and vLLM's server) answer `echo` with `logprobs` with null for the prompt's
    first token, which has nothing before it; the SDK's type says a number. Only that null is let
    through: it is given a number for the check, in a copy."""
    import copy

    body = copy.deepcopy(body)
    for choice in body["choices"]:
        logprobs = choice.get("logprobs")
        if logprobs and logprobs.get("token_logprobs") and logprobs["token_logprobs"][0] is None:
            logprobs["token_logprobs"][0] = 0.0
            if logprobs["top_logprobs"][0] is None:
                logprobs["top_logprobs"][0] = {}
    return body

"""`/v1/responses` lines: the Responses API's request read as a chat, its answer written as a `Response`.

As vLLM's Responses serving does (`construct_input_messages`, `build_response_output_items`),
a Responses body is generated as a chat: `instructions` becomes the system message, `input`
(a string, or a list of messages and function_call / function_call_output items) the
conversation, the flat function `tools` the chat template's tools, `text.format` the
response_format. The answer is OpenAI's `Response` object: a reasoning item when the model
reasoned (model.reasoning_parser), a message item with the `output_text`, a function_call item
per tool call; `status` "incomplete" with `incomplete_details.reason` "max_output_tokens" when
the output was cut. Nothing is stored: `store`, `previous_response_id`-less batches only.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from worker.wire import BadRequest

#: Content part types of an input message and what a chat message calls them.
_TEXT_PARTS = ("input_text", "output_text", "text")


def input_messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """The chat messages of a Responses body (vLLM's `construct_input_messages`)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        if not isinstance(instructions, str):
            raise BadRequest("invalid_parameter", "instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("invalid_input", "input must be a string or a non-empty list of input items", "input")
    for i, item in enumerate(items):
        message = _message(item, i, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _message(item: Any, i: int, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as a chat message; None when it joined the previous assistant message."""
    if not isinstance(item, dict):
        raise BadRequest("invalid_input", f"input[{i}] must be an object", "input")
    kind = item.get("type", "message")
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function"}
        call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
        if not isinstance(call["id"], str) or not isinstance(item.get("name"), str):
            raise BadRequest("invalid_input", f"input[{i}]: a function_call needs call_id and name", "input")
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            raise BadRequest("invalid_input", f"input[{i}]: a function_call_output needs its output text", "input")
        return {"role": "tool", "content": output, "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        return None  # earlier reasoning is not shown to the model again (vLLM keeps it apart too)
    if kind != "message" or not isinstance(item.get("role"), str):
        raise BadRequest("invalid_input", f"input[{i}]: unsupported input item type {kind!r}", "input")
    return {"role": item["role"], "content": _content(item.get("content"), i)}


def _content(content: Any, i: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise BadRequest("invalid_input", f"input[{i}].content must be text or a list of content parts", "input")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise BadRequest("invalid_input", f"input[{i}].content: unsupported content part {kind!r}", "input")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def chat_tools(tools: Any, tool_choice: Any) -> tuple[Any, Any]:
    """Responses' flat function tools and tool_choice in the chat shape (`{"type", "function": {...}}`)."""
    if tools is None:
        return None, tool_choice
    if not isinstance(tools, list):
        raise BadRequest("invalid_parameter", "tools must be a list", "tools")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(
                "unsupported_parameter", f"tools[{i}]: only function tools are supported here, not {kind!r}", "tools"
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        converted.append({"type": "function", "function": function})
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        tool_choice = {"type": "function", "function": {"name": tool_choice.get("name")}}
    return converted, tool_choice


def response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format` it means."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("invalid_parameter", "text.format must be an object", "text")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return {"type": fmt.get("type")}


def response_body(
    echo: dict[str, Any],
    *,
    model: str,
    items: list[dict[str, Any]],
    cut: bool,
    usage: dict[str, Any],
    reasoning_tokens: int,
) -> dict[str, Any]:
    """OpenAI's `Response` object for one line: `echo` holds the request fields it repeats."""
    input_tokens, output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "output": items,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        },
        **echo,
    }


def output_items(reasoning: str | None, text: str, tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Response's output: a reasoning item, a message item, function_call items; each only when
    there is something to put in it (vLLM's `build_response_output_items`)."""
    items: list[dict[str, Any]] = []
    if reasoning:
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if text:
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in tool_calls:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "completed",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            }
        )
    return items

"""Prompt preparation for every engine: the chat template (text or file), tokenisation, the context check.

Both engines hand each request to one `PromptBuilder` and feed the engine the token ids it
returns, so the same request becomes the same prompt whichever engine runs it. The steps, in order:
1. render: a chat request's messages through the chat template (the spec's, else the model's;
   `developer` messages become `system` where the template knows no such role, and an assistant
   turn's tool-call `arguments` become the object they spell, as in vLLM's server);
   a completion request's prompt as it is;
2. tokenise: the rendered chat text without adding special tokens (the template wrote the ones it
   wants), a completion prompt with the tokenizer's own;
3. check: prompt plus `max_tokens` must fit the context; otherwise the row gets its error line.
A failure in any step is that row's error, never the batch's. What a later request needs (tools
for the template, images beside the text) joins `render` and `Prompt`, not a second path.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from orchestrator.core.chat_template import read_chat_template
from worker.wire import EngineRequest, RowResult, error_row

log = logging.getLogger("orch.worker")


@dataclass(frozen=True)
class Prompt:
    """What an engine generates from: the prompt's token ids."""

    token_ids: list[int]


class PromptBuilder:
    """Turns requests into prompts for one model: one tokenizer, one chat template, one context length."""

    def __init__(self, tokenizer: Any, chat_template: str | None, max_model_len: int):
        self.tokenizer = tokenizer
        self.chat_template = read_chat_template(chat_template)
        self.max_model_len = max_model_len

    def build(self, request: EngineRequest, tools: list[dict[str, Any]] | None = None) -> Prompt | RowResult:
        """The request's prompt, or its error row (the template failed, or it does not fit the context).
        `tools`: the tool definitions as the chat template takes them (worker/tools.py)."""
        try:
            ids = self._tokenize(request, tools)
        except Exception as e:  # a template that fails on this conversation fails this row only
            return error_row(request, "template_error", f"cannot apply the chat template: {e}")
        keep = request.prompt_options.truncate_prompt_tokens
        if keep is not None:
            if keep > self.max_model_len:
                return error_row(
                    request,
                    "invalid_parameter",
                    f"truncate_prompt_tokens={keep} is more than this model's context ({self.max_model_len})",
                    param="truncate_prompt_tokens",
                )
            side = request.prompt_options.truncation_side or "left"  # vLLM's default for generation: keep the end
            # -1: as many as leave room for max_tokens (vLLM would shorten max_tokens instead).
            ids = truncated(ids, keep if keep >= 0 else max(self.max_model_len - request.params.max_tokens, 0), side)
        max_tokens = request.params.max_tokens
        if len(ids) + max_tokens > self.max_model_len:
            too_long = {"chat": "messages", "response": "input"}.get(request.kind, "prompt")
            return error_row(
                request,
                "context_length_exceeded",
                f"this model's maximum context length is {self.max_model_len} tokens; the request has "
                f"{len(ids)} prompt tokens and asks for {max_tokens} more",
                param="max_tokens" if len(ids) < self.max_model_len else too_long,
            )
        return Prompt(ids)

    def echo_text(self, request: EngineRequest) -> str:
        """What completions' `echo` puts before the answer: the prompt, decoded when given as token ids."""
        if not request.params.echo or request.prompt is None:
            return ""
        return request.prompt if isinstance(request.prompt, str) else str(self.tokenizer.decode(list(request.prompt)))

    def _tokenize(self, request: EngineRequest, tools: list[dict[str, Any]] | None) -> list[int]:
        options = request.prompt_options
        if request.kind in ("chat", "response"):
            template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
            text = self.tokenizer.apply_chat_template(
                for_template(with_argument_objects(request.messages or [], request.custom_id), template),
                add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message,
                tokenize=False,
                chat_template=self.chat_template,
                tools=tools,
                **json.loads(options.chat_template_kwargs),
            )
            return list(self.tokenizer.encode(text, add_special_tokens=bool(options.add_special_tokens)))
        if isinstance(request.prompt, tuple):  # token ids, as they are
            return list(request.prompt)
        return list(self.tokenizer.encode(request.prompt, add_special_tokens=options.add_special_tokens is not False))


def truncated(ids: list[int], keep: int, side: str) -> list[int]:
    """`keep` of the prompt's tokens, as vLLM truncates (`truncate_prompt_tokens`): the last ones
    for side "left", the first for "right"."""
    if keep >= len(ids):
        return ids
    if keep == 0:
        return []
    return ids[-keep:] if side == "left" else ids[:keep]


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


def with_argument_objects(messages: list[dict[str, Any]], custom_id: str) -> list[dict[str, Any]]:
    """The messages with each assistant tool call's `arguments` as a dict, as vLLM's server hands
    them to the chat template (the Hugging Face convention: templates render them with `tojson`).
    As vLLM does: absent or empty arguments become {}, and so do arguments that are not a JSON
    object (a warning names the row), so a bad call in the history does not fail the row; an
    empty `tool_calls` list is dropped, keeping the template on its plain assistant path."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message["role"] != "assistant" or not isinstance(calls, list):
            out.append(message)
        elif not calls:
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
        else:
            parsed = [_with_argument_object(call, custom_id) for call in calls]
            out.append({**message, "tool_calls": parsed})
    return out


def _with_argument_object(call: dict[str, Any], custom_id: str) -> dict[str, Any]:
    function = call["function"]  # requests.py let through only calls with a function object
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except ValueError:
            log.warning(
                "row %s: tool call %r: arguments are not JSON; the chat template gets {} (as vLLM's server)",
                custom_id,
                function.get("name"),
            )
            arguments = {}
    if not isinstance(arguments, dict):
        if arguments:
            log.warning(
                "row %s: tool call %r: arguments are a %s, not a JSON object; the chat template gets {} "
                "(as vLLM's server)",
                custom_id,
                function.get("name"),
                type(arguments).__name__,
            )
        arguments = {}
    return {**call, "function": {**function, "arguments": arguments}}

"""Tool calling and reasoning: `tools` and `tool_choice` checked per row, vLLM's own parsers around generation.

`tool_use` reads a body (no engine needed). `VllmTools` does on the vLLM engine what vLLM's
OpenAI server does: it renders the tools into the chat template as the server does, lets the
parser chosen in the spec (model.tool_parser) adjust the request (a `required` or named
tool_choice becomes a structured-output constraint on the call), and parses the generated text
back into `message.tool_calls`. With model.reasoning_parser, the same composed parser (vLLM's
`ParserManager`) reads every row's thinking off into `message.reasoning`. Rows therefore match
`vllm run_batch` with the same parsers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from worker.wire import ToolUse

TOOL_CHOICES = ("none", "auto", "required")


class ToolError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def tool_use(body: dict[str, Any]) -> ToolUse | None:
    """The row's tool use, or None when it has no tools; a ToolError names what is wrong."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise ToolError("tool_choice needs tools", "tool_choice")
        return None
    names = _tool_names(tools)
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        named = choice.get("function") if choice.get("type") == "function" else None
        name = named.get("name") if isinstance(named, dict) else None
        if name not in names:
            raise ToolError(
                f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})", "tool_choice"
            )
    elif choice not in TOOL_CHOICES:
        raise ToolError(
            f'tool_choice={choice!r}: expected none, auto, required or {{"type": "function", ...}}', "tool_choice"
        )
    return ToolUse(json.dumps(tools), json.dumps(choice), parallel)


def _tool_names(tools: Any) -> list[str]:
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools must be a non-empty list", "tools")
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ToolError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ToolError(f"tools[{i}].function.name must be a non-empty string", "tools")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.append(function["name"])
    return names


@dataclass
class ToolCallRequest:
    """What generating and parsing one row needs when the run has a parser (tools, reasoning): vLLM's
    own request model, adjusted by the parser, and the tools as the chat template sees them."""

    vllm_request: Any
    template_tools: list[dict[str, Any]] | None
    #: vLLM's StructuredOutputsParams for the row, or None (tool_choice none or auto).
    structured_outputs: Any
    #: The row's prompt, for parsers that read where thinking starts from it (set once it is built).
    prompt_token_ids: list[int] = field(default_factory=list)


@dataclass
class Parsed:
    """One generated text read back: what it says, the calls it makes, the reasoning before them."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    reasoning: str | None
    #: Generated tokens inside the reasoning; None when the run has no reasoning parser.
    reasoning_tokens: int | None


class VllmTools:
    """vLLM's tool parser `parser_name` and reasoning parser `reasoning_parser` over one tokenizer,
    composed as vLLM's server composes them (`ParserManager.get_parser`)."""

    def __init__(self, parser_name: str | None, tokenizer: Any, model_config: Any, reasoning_parser: str | None = None):
        from vllm.parser.parser_manager import ParserManager

        self.tokenizer = tokenizer
        self.model_config = model_config
        self.parser_name = parser_name
        self.reasoning_parser = reasoning_parser
        self.parser_cls = ParserManager.get_parser(
            tool_parser_name=parser_name,
            reasoning_parser_name=reasoning_parser,
            enable_auto_tools=True,
            tokenizer=tokenizer,
        )

    @property
    def parses_every_row(self) -> bool:
        """Whether rows without tools are read back too (a reasoning model's thinking)."""
        return bool(self.reasoning_parser)

    def prepare(
        self, messages: list[dict[str, Any]], use: ToolUse | None, constraint: dict[str, Any] | None
    ) -> ToolCallRequest:
        """vLLM's request for the row; a ToolError when the row needs a parser the spec does not name."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        choice = use.choice if use is not None else None
        if use is not None and not self.parser_name and choice != "none":
            raise ToolError(
                f"tool_choice {choice!r} needs a tool parser: set model.tool_parser in the spec (hermes, ...)",
                "tool_choice",
            )
        tooling = (
            {"tools": json.loads(use.tools), "tool_choice": choice, "parallel_tool_calls": use.parallel_tool_calls}
            if use is not None
            else {}
        )
        request = ChatCompletionRequest(
            model=self.model_config.model, messages=messages, structured_outputs=constraint, **tooling
        )
        template_tools = [tool.model_dump() for tool in request.tools] if use is not None and request.tools else None
        # As vLLM's server: the parser adjusts the request unless tools are off for this row.
        if self.parser_cls is not None and choice != "none":
            request = self._parser(request).adjust_request(request)
        return ToolCallRequest(request, template_tools, request.extract_structured_outputs())

    def parse(self, prepared: ToolCallRequest, text: str, token_ids: Any) -> Parsed:
        """The text's content, tool calls (in the OpenAI shape) and reasoning, as vLLM's server reads them."""
        from vllm.renderers.chat_utils import make_tool_call_id

        request = prepared.vllm_request
        if self.parser_cls is None:
            return Parsed(text, [], None, None)
        parser = self._parser(request)
        parser.set_prompt_token_ids(prepared.prompt_token_ids)
        reasoning, content, calls = parser.parse(
            text, request, enable_auto_tools=True, model_output_token_ids=token_ids
        )
        tool_calls = [
            {
                "id": call.id or make_tool_call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls or []
        ]
        if request.parallel_tool_calls is False:
            tool_calls = tool_calls[:1]
        counted = parser.count_reasoning_tokens(token_ids) if self.reasoning_parser else None
        return Parsed(content, tool_calls, reasoning, counted)

    def _parser(self, request: Any) -> Any:
        # Parsers keep state per generation: one per use, as vLLM's server does.
        assert self.parser_cls is not None
        return self.parser_cls(self.tokenizer, request.tools, model_config=self.model_config)

"""The OpenAI Batch output line, as one model the worker writes and the part reader, collect and status read.

    {"id": "batch_req_<chunk>-<row>", "custom_id": ..., "error": null,
     "response": {"status_code": 200, "request_id": ..., "body": <chat.completion | text_completion | ...>}}

A failed row carries `error: {code, message}` and a response that reads like the HTTP answer the
OpenAI API would have given (`status_code` 400, or 500 for engine failures, and an error body).
The `id` names the chunk and the row: resume and collect put a line in its input row's place
without reading the chunk's input again. The body stays a mapping: its shape is the endpoint's
(chat, completions, embeddings), checked against the official SDK's types in the tests.
"""

from __future__ import annotations

import base64
import struct
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict


class LineModel(BaseModel):
    """Lines tolerate fields they do not know, so an older orch reads what a newer worker wrote."""

    model_config = ConfigDict(extra="ignore")


class BatchError(LineModel):
    """Why a row failed: an OpenAI-style error code (`invalid_parameter`, `context_length_exceeded`...)."""

    code: str
    message: str


class BatchResponse(LineModel):
    status_code: int
    request_id: str
    body: dict[str, Any] | None = None


class PromptTokensDetails(LineModel):
    #: Prompt tokens the engine's prefix cache already held (vLLM's `num_cached_tokens`).
    cached_tokens: int | None = None


class Usage(LineModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0


class BatchOutputLine(LineModel):
    id: str = "batch_req"
    custom_id: str | None
    response: BatchResponse | None = None
    error: BatchError | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def row(self) -> int:
        """The row of its chunk this line answers (from `batch_req_<chunk>-<row>`)."""
        return row_of(self.id)

    def usage(self) -> Usage:
        body = self.response.body if self.response is not None else None
        usage = body.get("usage") if body else None
        if not isinstance(usage, dict):
            return Usage()
        if "input_tokens" in usage:  # a Response's usage (/v1/responses), in the chat names
            details = usage.get("input_tokens_details")
            usage = {
                "prompt_tokens": usage.get("input_tokens") or 0,
                "completion_tokens": usage.get("output_tokens") or 0,
                "total_tokens": usage.get("total_tokens") or 0,
                "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens")}
                if isinstance(details, dict)
                else None,
            }
        return Usage.model_validate(usage)

    def first_choice(self) -> dict[str, Any]:
        """The first choice of a completion body (empty for errors and other endpoints)."""
        body = self.response.body if self.response is not None else None
        choices = body.get("choices") if body else None
        return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}

    def text(self) -> str | None:
        """The first choice's text: a chat message's content, or a completion's text (a Response's
        output_text)."""
        body = self.response.body if self.response is not None else None
        if body and body.get("object") == "response":
            return _output_text(body.get("output"))
        choice = self.first_choice()
        if isinstance(choice.get("text"), str):
            return str(choice["text"])
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else None

    def embeddings(self) -> list[list[float]] | None:
        """An embeddings body's vectors in input order, base64 ones decoded (little-endian float32,
        as OpenAI sends them); None for other bodies."""
        body = self.response.body if self.response is not None else None
        if not body or body.get("object") != "list" or not isinstance(body.get("data"), list):
            return None
        vectors = []
        for item in body["data"]:
            vector = item.get("embedding") if isinstance(item, dict) else None
            if isinstance(vector, str):
                raw = base64.b64decode(vector)
                vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
            vectors.append(vector if isinstance(vector, list) else [])
        return vectors

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def error_row(
        cls,
        custom_id: str | None,
        code: str,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        line_id: str = "batch_req",
    ) -> BatchOutputLine:
        """A failed row: `error` set, and a response that reads like the API's HTTP answer."""
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        return cls(
            id=line_id,
            custom_id=custom_id,
            response=BatchResponse(status_code=status, request_id=new_request_id(), body=body),
            error=BatchError(code=code, message=message),
        )


def new_request_id() -> str:
    return uuid.uuid4().hex[:24]


def request_id(chunk: str, index: int) -> str:
    """The `id` of the output line answering row `index` of `chunk`."""
    return f"batch_req_{chunk}-{index}"


def row_of(line_id: str) -> int:
    return int(line_id.rsplit("-", 1)[1])


def _output_text(output: Any) -> str | None:
    """A Response's `output_text`: the text parts of its message items, joined (as the SDK does)."""
    if not isinstance(output, list):
        return None
    texts = [
        part["text"]
        for item in output
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
    ]
    return "".join(texts)

"""Errors as the OpenAI API answers them: an HTTP status and `{"error": {message, type, param, code}}`."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request the API refuses; the app turns it into OpenAI's error shape (the SDK raises its own
    typed exceptions from it: NotFoundError for 404, AuthenticationError for 401...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        #: Headers the answer carries (a 401's WWW-Authenticate).
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def not_found(kind: str, object_id: str) -> APIError:
    """What OpenAI answers for an id that does not exist, and here also for another key's ids."""
    return APIError(404, f"No such {kind} object: {object_id}", param="id")

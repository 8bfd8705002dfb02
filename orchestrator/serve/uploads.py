"""Request bodies read as they arrive, after the key is checked, each bounded in size and time.

FastAPI reads a body (File() and Form() spool it to disk, a JSON model holds it in memory) before
any dependency runs, the key check included. The routes that take a body read it themselves
instead, once `Owner` has accepted the key, so a request without a known key is answered before
a byte of its body is read. Then:

    Content-Length over the limit    refused before reading (400)
    an upload's file part            written to one temp file, counted; past the limit: refused (400)
    its other fields (purpose...)    kept in memory, a few KiB at most
    a JSON body                      kept in memory, up to its own small limit
    no byte for idle_timeout s       dropped (408); so is a body still coming after total_timeout s

What a refused upload wrote is removed at once, and what the client sends after the answer is
read and dropped by uvicorn (never stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from orchestrator.serve.errors import APIError

#: Room in the body for what surrounds the file: boundaries, part headers and the small fields.
FORM_OVERHEAD = 64 * 1024
#: The most the fields other than the file (purpose, expires_after...) may hold together.
MAX_FIELD_BYTES = 16 * 1024


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int
    idle_timeout: float
    total_timeout: float


@dataclass(frozen=True)
class Upload:
    """What a multipart upload carried: its file (spooled at `path`) and its other fields."""

    path: str
    filename: str | None
    bytes: int
    fields: dict[str, str]


@contextlib.asynccontextmanager
async def receive_upload(request: Request, limits: UploadLimits, folder: str) -> AsyncIterator[Upload]:
    """Read the request's multipart body into one temp file in `folder` (removed on leaving)."""
    boundary = _boundary(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes + FORM_OVERHEAD:
        raise _too_large(limits.max_bytes)
    fd, path = tempfile.mkstemp(prefix="orch-upload-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            form = _Form(boundary, out, limits.max_bytes)
            received = 0
            async for chunk in _body(request, limits):
                received += len(chunk)
                if received > limits.max_bytes + FORM_OVERHEAD:
                    raise _too_large(limits.max_bytes)
                # Parsing writes the file's bytes: off the event loop, which serves every other request.
                await run_in_threadpool(form.feed, chunk)
            upload = form.finish(path)
        yield upload
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


async def read_body(request: Request, limits: UploadLimits, max_bytes: int) -> bytes:
    """A small body (JSON), whole: refused (400) past `max_bytes`, with the same time bounds as an upload."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _body_too_large(max_bytes)
    body = bytearray()
    async for chunk in _body(request, limits):
        body.extend(chunk)
        if len(body) > max_bytes:
            raise _body_too_large(max_bytes)
    return bytes(body)


async def _body(request: Request, limits: UploadLimits) -> AsyncIterator[bytes]:
    """The body a read at a time, each read bounded: a stalled or endless body ends with a 408."""
    deadline = time.monotonic() + limits.total_timeout
    while True:
        left = deadline - time.monotonic()
        wait = min(limits.idle_timeout, left)
        try:
            if wait <= 0:
                raise asyncio.TimeoutError
            message = await asyncio.wait_for(request.receive(), wait)
        except asyncio.TimeoutError:
            if wait < limits.idle_timeout:
                what = f"The request body was still arriving after {limits.total_timeout:g} s, the most one may take"
            else:
                what = f"The client sent nothing of the request body for {limits.idle_timeout:g} s"
            raise APIError(408, f"{what}. Send the request again.") from None
        if message["type"] == "http.disconnect":
            raise APIError(400, "The client closed the connection before the request body ended.")
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


class _Form:
    """The multipart parser and its callbacks: the `file` part's bytes go to `out`, counted; the other
    parts' bytes are kept as small text fields (another file part is read and dropped)."""

    def __init__(self, boundary: bytes, out: IO[bytes], max_bytes: int):
        self.out, self.max_bytes = out, max_bytes
        self.file_bytes = self.field_bytes = 0
        self.filename: str | None = None
        self.fields: dict[str, str] = {}
        self.has_file = self.ended = False
        self._header_name, self._header_value = bytearray(), bytearray()
        self._disposition = b""
        self._part: str | None = None  # "file", a field's name, or None: a part that is dropped
        self._value = bytearray()
        self.parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._part_begin,
                "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
                "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
                "on_end": self._end,
            },
        )

    def feed(self, chunk: bytes) -> None:
        try:
            self.parser.write(chunk)
        except FormParserError as e:
            raise APIError(400, f"The request body is not a valid multipart form: {e}.") from None

    def finish(self, path: str) -> Upload:
        if not self.ended:
            raise APIError(400, "The multipart form ended before its closing boundary: send the file again.")
        if not self.has_file:
            raise APIError(400, "Missing required parameter: 'file'.", param="file")
        return Upload(path=path, filename=self.filename, bytes=self.file_bytes, fields=dict(self.fields))

    def _part_begin(self) -> None:
        self._disposition, self._part = b"", None
        self._header_name.clear()
        self._header_value.clear()
        self._value.clear()

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "file" and b"filename" in options:
            if self.has_file:
                raise APIError(400, "The form holds more than one 'file': upload one file per request.", param="file")
            self.has_file, self._part = True, "file"
            self.filename = os.path.basename(options[b"filename"].decode("utf-8", "replace")) or None
        elif name and b"filename" not in options:
            self._part = name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        size = end - start
        if self._part == "file":
            if self.file_bytes + size > self.max_bytes:
                raise _too_large(self.max_bytes)
            self.out.write(data[start:end])
            self.file_bytes += size
        elif self._part is not None:
            self.field_bytes += size
            if self.field_bytes > MAX_FIELD_BYTES:
                raise APIError(
                    400, f"The form's fields other than 'file' hold more than {MAX_FIELD_BYTES:,} bytes together."
                )
            self._value.extend(data[start:end])

    def _part_end(self) -> None:
        if self._part is not None and self._part != "file":
            self.fields[self._part] = self._value.decode("utf-8", "replace")

    def _end(self) -> None:
        self.ended = True


def _boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise APIError(
            400,
            f"Invalid Content-Type {content_type!r}: upload the file as multipart/form-data "
            "(fields 'file' and 'purpose'), as the OpenAI SDK's files.create does.",
        )
    return boundary


def _too_large(max_bytes: int) -> APIError:
    return APIError(
        400,
        f"File is too large: more than {max_bytes:,} bytes, the most this server takes. "
        "Split the requests into smaller files, one batch each.",
        param="file",
    )


def _body_too_large(max_bytes: int) -> APIError:
    return APIError(400, f"The request body is too large: more than {max_bytes:,} bytes, the most this route takes.")

"""HTTP over a bare socket, for bodies no client library sends: huge or slow, made as they go, answered early.

`post` sends a body piece by piece from an iterator (never whole in memory), and reads the answer
the moment the server sends one, even before the body is over. `FolderPeak` watches a folder
(a server's TMPDIR) and keeps the most its files held at once.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

MiB = 1024**2


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    #: The body bytes sent when the answer came (the body may have been cut short by it).
    sent: int

    @property
    def message(self) -> str:
        return str(self.body.get("error", {}).get("message", ""))


def post(
    port: int, path: str, headers: dict[str, str], body: Iterable[bytes], *, chunked: bool, timeout: float = 60
) -> Answer:
    """POST `body` (Transfer-Encoding: chunked, or as it comes under the caller's Content-Length); the
    Host header says 127.0.0.1 unless `headers` give one."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        host = [] if any(k.lower() == "host" for k in headers) else ["Host: 127.0.0.1"]
        lines = [f"POST {path} HTTP/1.1", *host, *(f"{k}: {v}" for k, v in headers.items())]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sent = 0
        for piece in body:
            if _readable(sock):
                break  # answered before the body ended
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server stopped reading: its answer is there to read
            sent += len(piece)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        return Answer(response.status, json.loads(data) if data else {}, sent)


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def multipart(boundary: str, filename: str, purpose: str = "batch") -> tuple[bytes, bytes]:
    """The form an upload sends around its file's bytes, as the openai SDK lays it out: (before, after)."""
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    return head.encode(), f"\r\n--{boundary}--\r\n".encode()


def pieces(total: int, size: int, *, every: float = 0.0, stop: threading.Event | None = None) -> Iterator[bytes]:
    """`total` bytes of JSON-lines-looking filler in pieces of `size`, one every `every` seconds."""
    piece = (b'{"custom_id": "x"}\n' * (size // 19 + 1))[:size]
    while total > 0 and not (stop is not None and stop.is_set()):
        yield piece[:total]
        total -= size
        if every:
            time.sleep(every)


class FolderPeak:
    """The most bytes a folder's files held at once while watched (sampled every couple of milliseconds)."""

    def __init__(self, folder: os.PathLike[str] | str, interval: float = 0.002):
        self.folder, self.interval = folder, interval
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> FolderPeak:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.bytes = max(self.bytes, folder_bytes(self.folder))

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.bytes = max(self.bytes, folder_bytes(self.folder))
            time.sleep(self.interval)


def folder_bytes(folder: os.PathLike[str] | str) -> int:
    """What the files under `folder` hold now (files removed while counted count 0)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total

"""An HTTP proxy that misbehaves on purpose, in front of a real S3 server.

It answers 503 SlowDown, or forwards a request and then drops the connection before the answer
(the write happened, the client never hears of it): the failures a store must retry through.
`SilentServer` is worse: it accepts connections and never answers at all.
"""

from __future__ import annotations

import http.client
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlparse

#: Decides, per request, what the proxy does: "forward", "503" or "drop-response".
Policy = Callable[[str, str, dict[str, str]], str]


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one request upstream, or fails it as the proxy's policy says."""

    protocol_version = "HTTP/1.1"
    proxy: FlakyProxy  # set on the subclass each proxy makes

    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        body = self._read_body()
        headers = dict(self.headers.items())
        action = self.proxy.policy(self.command, self.path, headers)
        self.proxy.log.append((self.command, self.path, action))
        if self.proxy.delay_s:
            time.sleep(self.proxy.delay_s)
        if action == "503":
            self._slow_down()
            return
        upstream = self.proxy.upstream
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
        headers.pop("Transfer-Encoding", None)
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if action == "drop-response":
            self.close_connection = True
            self.connection.close()
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _slow_down(self) -> None:
        payload = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Content-Type", "application/xml")
        self.end_headers()
        self.wfile.write(payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FlakyProxy:
    """`delay_s` holds every request that long first: a store far away (another region)."""

    def __init__(self, upstream: str, policy: Policy, *, delay_s: float = 0.0):
        self.upstream = urlparse(upstream)
        self.policy = policy
        self.delay_s = delay_s
        self.log: list[tuple[str, str, str]] = []
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class SilentServer:
    """Accepts TCP connections and never answers: an endpoint that hangs every request."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        #: When each connection was accepted (time.monotonic()): a client's waits are timed from its first.
        self.connected_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connected_at.append(time.monotonic())
            self._held.append(conn)  # kept open, never read from or written to

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._sock.close()

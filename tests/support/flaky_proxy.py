"""An HTTP proxy that misbehaves on purpose, in front of a real S3 server.

It answers 503 SlowDown, or forwards a request and then drops the connection before the answer
(the write happened, the client never hears of it): the failures a store must retry through.
"""

from __future__ import annotations

import http.client
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import urlparse

#: Decides, per request, what the proxy does: "forward", "503" or "drop-response".
Policy = Callable[[str, str, dict[str, str]], str]


class FlakyProxy:
    def __init__(self, upstream: str, policy: Policy):
        self.upstream = urlparse(upstream)
        self.policy = policy
        self.log: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self._read_body()
                headers = {k: v for k, v in self.headers.items()}
                action = proxy.policy(self.command, self.path, headers)
                proxy.log.append((self.command, self.path, action))
                if action == "503":
                    payload = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Content-Type", "application/xml")
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
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

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FlakyProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

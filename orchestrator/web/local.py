"""`orch status --web`: one run's page (and its /metrics) from a small server on this machine, for a
store no `orch serve` watches. The same page code as `orch serve`'s; loopback only (no keys here:
reach it from elsewhere through `ssh -L`), and only under a loopback name: a request whose Host
names another (a DNS-rebinding page's) is refused (web/hosts.py). It answers GET only."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

from orchestrator.controller.status import to_json
from orchestrator.web.hosts import AllowedHosts
from orchestrator.web.metrics import CONTENT_TYPE, exposition
from orchestrator.web.page import render_page
from orchestrator.web.snapshots import Snapshots

HOST = "127.0.0.1"
#: The loopback names only: through `ssh -L` a browser names the forwarded port on its own localhost.
LOOPBACK_ONLY = AllowedHosts()


def page_server(snapshots: Snapshots, run: str, port: int, refresh_s: float) -> ThreadingHTTPServer:
    """A server (not yet serving) of `/runs/<run>` (also `/`), `/runs/<run>/status.json` and `/metrics`."""
    page_path = f"/runs/{run}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path).rstrip("/") or "/"
            if not LOOPBACK_ONLY.allows(self.headers.get("Host")):
                message = f"Invalid Host header: this page answers to {LOOPBACK_ONLY.describe()} only\n"
                self._send(400, "text/plain; charset=utf-8", message.encode(), {})
            elif path in ("/", page_path):
                snap = snapshots.get(run)
                page = snap.view("page", lambda s: render_page(s.status, refresh_s=refresh_s, taken_at=s.taken_at))
                self._send(200, "text/html; charset=utf-8", page.html.encode(), page.headers)
            elif path == f"{page_path}/status.json":
                body = json.dumps(to_json(snapshots.get(run).status)).encode()
                self._send(200, "application/json", body, {"Cache-Control": "no-store"})
            elif path == "/metrics":
                metrics = snapshots.get(run).view("metrics", lambda s: exposition(lambda: [s.status]))
                self._send(200, CONTENT_TYPE, metrics, {})
            else:
                self._send(404, "text/plain; charset=utf-8", f"not here: try {page_path}\n".encode(), {})

        def _send(self, code: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the terminal shows the address, not every request

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    return server


def serve_page(snapshots: Snapshots, run: str, port: int, refresh_s: float, announce: Callable[[str], None]) -> None:
    """Serve until interrupted (Ctrl-C); `announce` gets the page's address once it listens."""
    server = page_server(snapshots, run, port, refresh_s)
    announce(f"http://{HOST}:{server.server_address[1]}/runs/{quote(run)}")
    try:
        server.serve_forever()
    finally:
        server.server_close()

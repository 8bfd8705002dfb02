"""`orch status --web`: one run's page (and its /metrics) from a small server on this machine, for a
store no `orch serve` watches, and beside it the store's other runs: their index at `/runs/` and
each one's page. The same page code as `orch serve`'s; loopback only (no keys here: reach it from
elsewhere through `ssh -L`), and only under a loopback name: a request whose Host names another (a
DNS-rebinding page's) is refused (web/hosts.py). It answers GET only."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.records.run import run_names
from orchestrator.runview.runs import context_in_store
from orchestrator.runview.status import to_json
from orchestrator.web.hosts import AllowedHosts
from orchestrator.web.metrics import CONTENT_TYPE, exposition
from orchestrator.web.page import page_of
from orchestrator.web.runs_index import index_rows, render_index
from orchestrator.web.snapshots import Snapshots

HOST = "127.0.0.1"
#: The loopback names only: through `ssh -L` a browser names the forwarded port on its own localhost.
LOOPBACK_ONLY = AllowedHosts()


#: An answer: status code, content type, body, extra headers.
Answer = tuple[int, str, bytes, dict[str, str]]
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class RunPages:
    """What the server answers, by path: `/runs/<run>` (`/`: ctx's run), `/runs/<run>/status.json`,
    `/runs/` (the store's runs) and `/metrics` (ctx's run). `snapshots` reads any run of the store."""

    snapshots: Snapshots
    ctx: RunContext
    refresh_s: float

    def answer(self, path: str) -> Answer:
        run = self.ctx.layout.run
        rest = path.removeprefix("/runs/") if path.startswith("/runs/") else None
        if path == "/":
            return self.run_page(run, json_only=False)
        if path == "/runs":
            rows = index_rows(run_names(self.ctx.store), self.snapshots.get)
            page = render_index(rows, self.ctx.spec.store, self.refresh_s)
            return 200, "text/html; charset=utf-8", page.html.encode(), page.headers
        if path == "/metrics":
            metrics = self.snapshots.get(run).view("metrics", lambda s: exposition(lambda: [s.status]))
            return 200, CONTENT_TYPE, metrics, {}
        if rest is not None and "/" not in rest.removesuffix("/status.json"):
            return self.run_page(rest.removesuffix("/status.json"), json_only=rest.endswith("/status.json"))
        return 404, TEXT, f"not here: try /runs/{run}\n".encode(), {}

    def run_page(self, name: str, *, json_only: bool) -> Answer:
        try:
            snap = self.snapshots.get(name)
        except OrchError as e:  # a run that is not in the store, or a name that cannot be one
            return 404, TEXT, f"{e.message}\n".encode(), {}
        if json_only:
            return 200, "application/json", json.dumps(to_json(snap.status)).encode(), {"Cache-Control": "no-store"}
        page = page_of(snap, lambda: context_in_store(self.ctx, name), self.refresh_s)
        return 200, "text/html; charset=utf-8", page.html.encode(), page.headers


def page_server(snapshots: Snapshots, ctx: RunContext, port: int, refresh_s: float) -> ThreadingHTTPServer:
    """A server (not yet serving) of `RunPages`, on 127.0.0.1."""
    pages = RunPages(snapshots, ctx, refresh_s)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not LOOPBACK_ONLY.allows(self.headers.get("Host")):
                message = f"Invalid Host header: this page answers to {LOOPBACK_ONLY.describe()} only\n"
                answer: Answer = (400, TEXT, message.encode(), {})
            else:
                answer = pages.answer(unquote(urlsplit(self.path).path).rstrip("/") or "/")
            code, content_type, body, headers = answer
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for header, value in headers.items():
                self.send_header(header, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the terminal shows the address, not every request

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    return server


def serve_page(
    snapshots: Snapshots, ctx: RunContext, port: int, refresh_s: float, announce: Callable[[str], None]
) -> None:
    """Serve until interrupted (Ctrl-C); `announce` gets the page's address once it listens."""
    server = page_server(snapshots, ctx, port, refresh_s)
    announce(f"http://{HOST}:{server.server_address[1]}/runs/{quote(ctx.layout.run)}")
    try:
        server.serve_forever()
    finally:
        server.server_close()

"""The first thing every request meets: refused unless its Host names this server and, when it changes
something, unless it comes from no page or from this server's own (orchestrator/web/hosts.py).

It runs before routing, keys and bodies, so a refused request has had nothing read, written or started.
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.serve.errors import APIError
from orchestrator.web.hosts import AllowedHosts, foreign_origin

log = logging.getLogger("orch.serve")


class RequestGuard:
    """ASGI middleware: 400 for a Host this server does not answer to, 403 for a cross-origin change."""

    def __init__(self, app: ASGIApp, hosts: AllowedHosts):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, method = headers.get("host"), str(scope["method"])
        refusal = None
        if not self.hosts.allows(host):
            # The name a DNS-rebinding page's requests carry: the page's own. Logged with what is allowed,
            # so an operator who reaches the server by a name not yet allowed sees the fix.
            log.warning("refused %s %s: Host %r is not one of %s", method, scope["path"], host, self.hosts.describe())
            refusal = APIError(
                400,
                f"Invalid Host header {host!r}: this server does not answer to that name. Its operator "
                "may allow it with `orch serve --allowed-host NAME` (or ORCH_SERVE_ALLOWED_HOSTS).",
                code="invalid_host",
            )
        else:
            why = foreign_origin(method, host, headers.get("origin"), headers.get("sec-fetch-site"))
            if why is not None:
                log.warning("refused %s %s: %s", method, scope["path"], why)
                refusal = APIError(403, f"Cross-origin request refused: {why}.", code="cross_origin")
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await JSONResponse(refusal.body(), status_code=refusal.status)(scope, receive, send)

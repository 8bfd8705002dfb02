"""Which requests a local server answers at all: the Host it is named by, and where a state-changing request comes from.

A browser lets any web page send requests to 127.0.0.1: a form post, or its scripts once the
page's own name resolves to 127.0.0.1 (DNS rebinding). Two checks shut that door, as Django
(ALLOWED_HOSTS, its CSRF Origin check) and Jupyter (its local host names) shut it:

1. The `Host` header must name this server: a loopback name (`localhost`, `127.0.0.1`, `[::1]`,
   any loopback address, any port) or one the operator allowed. A rebinding page's requests carry the page's own name.
2. A request that changes something (any method but GET, HEAD, OPTIONS) coming from a browser
   page must come from the server's own origin: its `Origin` names the same host and port as its
   `Host` (absent an `Origin`, `Sec-Fetch-Site` must not say another site). A form on another
   site, or on another port of this machine, is refused. Clients other than browsers send neither
   header and pass.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchestrator.core.errors import SpecError

#: Methods that read only: a cross-site one can change nothing (and a browser keeps its answer from the page).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What `Sec-Fetch-Site` says of a request a browser made from this server's own pages (or typed by its user).
OWN_FETCH_SITES = frozenset({"same-origin", "none"})


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, without port or brackets) is this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` or `[v6]:port` as (name lowercased, without brackets or a final dot; port), None if malformed."""
    if not value or any(c in value for c in "/?#@\\ \t"):
        return None
    try:
        parts = urlsplit(f"//{value}")
        name, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, an unclosed bracket
        return None
    if not name:
        return None
    return name.removesuffix("."), port


@dataclass(frozen=True)
class AllowedHosts:
    """The names a request's Host may give: the loopback ones, then `names` as the operator wrote them:
    `orch.example.com` (that name), `.example.com` or `*.example.com` (it and every name under it), `*` (any)."""

    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str], *, where: str) -> AllowedHosts:
        """The operator's entries, each checked (a name, an address, a pattern; no port, scheme or path)."""
        names = []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            if entry == "*":
                names.append(entry)
                continue
            lowered = entry.lower()
            if ":" in lowered and not lowered.startswith("["):  # an IPv6 address as `--host ::1` takes it
                lowered = f"[{lowered}]"
            under = lowered.startswith(("*.", "."))
            bare = lowered.split(".", 1)[1] if lowered.startswith("*.") else lowered.removeprefix(".")
            parsed = split_host(bare)
            if parsed is None or parsed[1] is not None or "*" in parsed[0]:
                raise SpecError(
                    f"allowed host {entry!r} is not a host name",
                    where=where,
                    hint="give a name or an address without scheme or port: orch.example.com, .example.com, 10.0.0.5",
                )
            names.append("." + parsed[0] if under else parsed[0])
        return cls(tuple(names))

    def allows(self, host_header: str | None) -> bool:
        """Whether a request whose Host header says `host_header` is meant for this server."""
        parsed = split_host(host_header or "")
        if parsed is None:
            return False
        name = parsed[0]
        return is_loopback(name) or any(_matches(name, allowed) for allowed in self.names)

    def describe(self) -> str:
        return ", ".join(["localhost", "127.0.0.1", "[::1]", *(f"[{n}]" if ":" in n else n for n in self.names)])


def _matches(name: str, allowed: str) -> bool:
    if allowed == "*":
        return True
    if allowed.startswith("."):  # the name itself and every name under it
        return name == allowed[1:] or name.endswith(allowed)
    return name == allowed


def foreign_origin(method: str, host_header: str | None, origin: str | None, fetch_site: str | None) -> str | None:
    """Why a request that changes something comes from a page of another origin, or None when it does not."""
    if method.upper() in SAFE_METHODS:
        return None
    if origin is not None:
        own = split_host(host_header or "")
        scheme, _, netloc = origin.partition("://")
        theirs = split_host(netloc) if scheme in ("http", "https") else None
        if own is None or theirs != own:
            return f"a page of {origin} may not change anything here"
        return None
    if fetch_site is not None and fetch_site.lower() not in OWN_FETCH_SITES:
        return f"a page of another site ({fetch_site}) may not change anything here"
    return None

"""Who may do what: API keys, known to the server only by their hashes, and the owner each one is.

A request carries its key as `Authorization: Bearer KEY`. A browser opening a run's page may send it
as the password of HTTP Basic auth instead, and only there: a browser attaches the Basic credentials
it remembers to any request for this server, a form posted by another site's page included, so the
API (`/v1`) refuses Basic auth outright. Keys come from ORCH_API_KEYS (comma-separated) and
--api-keys-file (one per line, `#` comments).
The server hashes them as it reads them and forgets the keys; a file or batch records the hash of
the key that made it (its owner), so a key sees only its own objects and the store never holds a
key in clear. Without keys the server is open (one owner for every request) and refuses to listen
on anything but loopback.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from orchestrator.core.errors import SpecError
from orchestrator.serve.errors import APIError
from orchestrator.web.hosts import is_loopback

#: The owner of every object when the server runs without keys.
OPEN_OWNER = "open"


def owner_of(key: str) -> str:
    """The owner a key stands for: 128 bits of its SHA-256 (keys are random secrets: no salt needed)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def load_owners(env_value: str | None, keys_file: str | None) -> frozenset[str]:
    """The owners of the configured keys (empty: no keys, an open server)."""
    keys = [k.strip() for k in (env_value or "").split(",")]
    if keys_file is not None:
        path = Path(keys_file)
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise SpecError(f"cannot read the API keys file: {e.strerror}", where=str(path)) from None
        from_file = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not from_file:
            raise SpecError("the API keys file holds no key", where=str(path), hint="one key per line")
        keys += from_file
    return frozenset(owner_of(k) for k in keys if k)


def check_exposure(host: str, owners: frozenset[str]) -> None:
    """Without keys anyone who reaches the port may run batches: only this machine, then."""
    if not owners and not is_loopback(host):
        raise SpecError(
            f"no API keys: refusing to serve on {host}, where other machines could use it",
            hint="set ORCH_API_KEYS=KEY1,KEY2 or --api-keys-file FILE, or serve on 127.0.0.1",
            where="--host",
        )


class Keys:
    """Turns a request's Authorization header into its owner, or refuses it (401)."""

    def __init__(self, owners: frozenset[str]):
        self.owners = owners

    @property
    def open(self) -> bool:
        return not self.owners

    def owner(self, authorization: str | None, *, basic: bool = False) -> str:
        """The owner of the request's key; `basic`: HTTP Basic credentials are taken too (the run page's)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "basic" and not basic:
            raise APIError(
                401,
                "HTTP Basic auth is not accepted on the API: send the key as Authorization: Bearer KEY.",
                code="basic_auth_refused",
            )
        if self.open:
            return OPEN_OWNER
        if scheme.lower() == "basic":  # a browser's: the key as the password (or as the user name)
            token = _basic_key(token)
            scheme = "bearer"
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(
                401,
                "You didn't provide an API key. Provide it in an Authorization header (Authorization: Bearer KEY).",
            )
        owner = owner_of(token.strip())
        if owner not in self.owners:
            # Never echo the key: messages reach logs and screens.
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return owner


def _basic_key(credentials: str) -> str:
    """The key in HTTP Basic credentials (`user:key`, base64): the password, or the user name without one."""
    try:
        user, _, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return ""
    return password or user

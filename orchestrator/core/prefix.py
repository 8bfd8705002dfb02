"""A request's prompt prefix, as prepare groups rows and the worker orders them (`--group-by-prefix`).

A row's prefix is the start of its request body (model, system message, first turn: what an
engine's prefix cache shares between rows). Canonical lines put the body last (custom_id, method
and url first), and a JSON string never holds `"body":` unescaped, so the body starts after the
first one. Comparing these bytes puts rows sharing a prefix side by side.
"""

from __future__ import annotations

import hashlib
import re

#: How much of the body names a row's prefix group, by default (ChunkingSpec.prefix_chars).
PREFIX_BYTES = 1024
_BODY = re.compile(rb'"body"\s*:\s*')


def prefix_head(line: bytes, prefix_bytes: int = PREFIX_BYTES) -> bytes:
    """The start of a canonical request line's body: the row's prefix key."""
    found = _BODY.search(line)
    start = found.end() if found else 0
    return line[start : start + prefix_bytes]


def prefix_hash(head: bytes) -> str:
    """A short name for a prefix group, as the manifest records it."""
    return hashlib.blake2b(head, digest_size=8).hexdigest()


def feed_order(lines: list[bytes]) -> list[int]:
    """The order a worker sends a window of a chunk's lines to its engine (indices into `lines`):
    by prefix, so rows sharing one meet in the prefix cache; longest line first within a prefix;
    then as written. The probe replays its rows through the engine's slots in this order."""
    return sorted(range(len(lines)), key=lambda i: (prefix_head(lines[i]), -len(lines[i]), i))

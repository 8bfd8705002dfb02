"""The object-store contract: the operations every run store offers, with the same atomicity everywhere."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, runtime_checkable

from orchestrator.core.errors import OrchError

#: How many keys one list request returns (S3's maximum; the local store pages the same way).
LIST_PAGE_SIZE = 1000


class StoreError(OrchError):
    """The store could not be reached or refused an operation (after retries)."""


class NotFound(StoreError):
    """The key does not exist."""

    def __init__(self, key: str):
        super().__init__(f"no object at {key!r}", where=None)
        self.key = key


class PreconditionFailed(StoreError):
    """A conditional write lost: the key already exists (put_if_absent) or changed (compare_and_swap).

    This is an expected outcome of races between workers, not a failure: callers branch on it.
    """

    def __init__(self, key: str):
        super().__init__(f"precondition failed for {key!r}")
        self.key = key


class InvalidKey(StoreError):
    """A key that would escape the store root or that the backends cannot hold."""


@dataclass(frozen=True)
class Blob:
    """An object's bytes and the ETag to use for a later compare-and-swap."""

    data: bytes
    etag: str


@dataclass(frozen=True)
class ObjectInfo:
    """One entry of a listing or a head: what a list request returns, nothing more."""

    key: str
    size: int
    modified: float  # seconds since the epoch, by the store's clock
    #: A digest of the content where the store gives one in listings (S3's ETag), else None.
    etag: str | None = None


@dataclass
class RequestCounter:
    """Counts requests a store made to its backend (one per list page), for tests and benchmarks."""

    total: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, op: str) -> None:
        with self._lock:
            self.total += 1
            self.by_op[op] = self.by_op.get(op, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self.total = 0
            self.by_op.clear()


@runtime_checkable
class Store(Protocol):
    """A flat key space under one root (a directory, or a bucket and prefix).

    Keys are relative, '/'-separated, and never start with '/' or contain '..'.
    Writers of conditional objects (leases, markers) put something unique to the writer in the
    bytes, so a retried conditional write can tell its own earlier success from a lost race.
    """

    uri: str
    requests: RequestCounter
    #: Reachable from other machines (S3, R2), not only from this one (a directory, memory).
    shared: bool

    def get(self, key: str) -> Blob:
        """The object's bytes and ETag. Raises NotFound."""

    def head(self, key: str) -> ObjectInfo | None:
        """Size and modification time, or None when absent."""

    def put(self, key: str, data: bytes) -> str:
        """Write unconditionally; returns the new ETag. Readers see the old or the new bytes, never a mix."""

    def put_file(self, key: str, path: str) -> None:
        """Upload a local file (large chunk files) without reading it into memory."""

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create the object only if no object has the key. Raises PreconditionFailed otherwise."""

    def compare_and_swap(self, key: str, data: bytes, etag: str) -> str:
        """Replace the object only if its ETag is still `etag`. Raises PreconditionFailed otherwise."""

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every key under the prefix exactly once, fetched a page at a time.

        The order is unspecified across "directories" (AWS lists in byte order, SeaweedFS directory
        by directory). `start_after` skips keys up to and including it in byte order; use it on
        flat prefixes only (keys without a further '/'), where every backend agrees.
        """

    def delete(self, key: str) -> None:
        """Remove the key; deleting an absent key is not an error."""

    def open(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """Stream the object's bytes (large chunk and output files). Raises NotFound."""


def check_key(key: str) -> str:
    """Reject keys that would escape the root or mean different things on different backends."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidKey(f"invalid store key {key!r}: keys are relative paths to objects")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(f"invalid store key {key!r}: empty, '.' or '..' path segment")
    if len(key.encode()) > 1024:
        raise InvalidKey(f"store key longer than 1024 bytes: {key[:80]!r}...")
    return key

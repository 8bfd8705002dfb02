"""The object-store contract: the operations every run store offers, with the same atomicity everywhere."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import InvalidKey

#: How many keys one list request returns (S3's maximum; the local store pages the same way).
LIST_PAGE_SIZE = 1000

log = logging.getLogger("orch.store")
_strays: set[str] = set()


class StoreSettings(BaseModel):
    """How orch talks to its store: the spec's `store_settings` section.

    Interactive commands (status, collect, prepare, plan, launch) answer or fail within about 20 s
    on an endpoint that accepts connections and never answers: attempts x read_timeout plus
    botocore's backoff. Workers wait longer for each request, and ride out a store that stays
    unreachable for `outage_budget` seconds.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    connect_timeout: float = Field(5.0, gt=0, description="seconds to open a connection to an S3/R2 endpoint")
    read_timeout: float = Field(6.0, gt=0, description="seconds to wait for an answer (interactive commands)")
    attempts: int = Field(2, ge=1, description="tries per request, botocore's standard retries (interactive commands)")
    worker_read_timeout: float = Field(60.0, gt=0, description="seconds to wait for an answer (workers)")
    worker_attempts: int = Field(5, ge=1, description="tries per request (workers)")
    lock_timeout: float = Field(30.0, gt=0, description="local store: seconds to wait for another process's write lock")
    outage_budget: float = Field(
        600.0, ge=0, description="seconds a worker rides out an unreachable store before it exits 75 (relaunched)"
    )
    watch_outage_budget: float = Field(
        3600.0, ge=0, description="seconds `orch watch` (and run, launch --follow) waits out an unreachable store"
    )


@dataclass(frozen=True)
class Blob:
    """An object's bytes and the ETag to use for a later compare-and-swap."""

    data: bytes
    etag: str


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One entry of a listing or a head: what a list request returns, nothing more. Slotted: a
    simulated fleet's end game reads the times of every lease a thousand times over."""

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

    def check_space(self) -> None:
        """Raise StoreFull when the store can take no more writes (a local file system out of space),
        without writing anything; stores with no such limit (S3, memory) do nothing."""


def check_key(key: str) -> str:
    """Reject keys that would escape the root or mean different things on different backends."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidKey(f"invalid store key {key!r}: keys are relative paths to objects")
    parts = key.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise InvalidKey(f"invalid store key {key!r}: empty, '.' or '..' path segment")
    # Every store call checks its key (a simulated fleet makes millions): a key of at most 256
    # characters is at most 1,024 bytes in UTF-8, so only longer ones are encoded to be measured.
    if len(key) > 256 and len(key.encode()) > 1024:
        raise InvalidKey(f"store key longer than 1024 bytes: {key[:80]!r}...")
    return key


def ignore_stray(key: str, why: str) -> None:
    """Skip an object orch did not write where it lists its own (a README under stats/, a console
    folder marker, a lease of garbage bytes), with one warning per key and process: one bad object
    must never halt a fleet."""
    if key not in _strays:
        _strays.add(key)
        log.warning("ignoring %s: %s", key, why)

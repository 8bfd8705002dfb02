"""A run store in process memory: the simulator's store, with the same contract as the others."""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from orchestrator.core.errors import NotFound, PreconditionFailed
from orchestrator.core.store.base import (
    LIST_PAGE_SIZE,
    Blob,
    ObjectInfo,
    RequestCounter,
    check_key,
)


class _SortedKeys:
    """Keys in order, as a list of sorted blocks: inserts and deletes move one block, not every key
    (a single sorted list of 500,000 keys makes each insert move megabytes)."""

    BLOCK = 1024

    def __init__(self) -> None:
        self._blocks: list[list[str]] = []
        self._firsts: list[str] = []

    def add(self, key: str) -> None:
        if not self._blocks:
            self._blocks, self._firsts = [[key]], [key]
            return
        i = max(bisect.bisect_right(self._firsts, key) - 1, 0)
        block = self._blocks[i]
        bisect.insort(block, key)
        self._firsts[i] = block[0]
        if len(block) > 2 * self.BLOCK:
            self._blocks[i : i + 1] = [block[: self.BLOCK], block[self.BLOCK :]]
            self._firsts[i : i + 1] = [block[0], block[self.BLOCK]]

    def remove(self, key: str) -> None:
        i = max(bisect.bisect_right(self._firsts, key) - 1, 0)
        block = self._blocks[i]
        del block[bisect.bisect_left(block, key)]
        if block:
            self._firsts[i] = block[0]
        else:
            del self._blocks[i], self._firsts[i]

    def with_prefix(self, prefix: str, start: str, *, inclusive: bool) -> list[str]:
        """Keys that start with `prefix` and are >= start (or > start), in order (`start` >= prefix)."""
        # Every key with the prefix sorts below `bound`, except one that goes on with the highest
        # code point: checked one by one past it.
        bound = prefix + "\U0010ffff"
        out: list[str] = []
        blocks = self._blocks
        for b in range(max(bisect.bisect_right(self._firsts, start) - 1, 0), len(blocks)):
            block = blocks[b]
            j = bisect.bisect_left(block, start) if inclusive else bisect.bisect_right(block, start)
            k = bisect.bisect_left(block, bound, j)
            out += block[j:k]
            while k < len(block) and block[k].startswith(prefix):
                out.append(block[k])
                k += 1
            if k < len(block):
                break
        return out


class MemoryStore:
    """Objects in a dict, keys also kept sorted so listings page like S3's.

    `clock` stamps modification times; the simulator passes its virtual clock.
    """

    shared = False

    def __init__(self, clock: Callable[[], float] = time.time, name: str = "memory"):
        self.uri = f"memory://{name}"
        self.requests = RequestCounter()
        self._clock = clock
        self._objects: dict[str, tuple[bytes, str, float]] = {}
        # What listings hand out, made once per write: the simulator lists the same keys many times.
        self._infos: dict[str, ObjectInfo] = {}
        self._keys = _SortedKeys()
        self._lock = threading.Lock()
        self._generation = itertools.count(1)

    def get(self, key: str) -> Blob:
        self.requests.add("get")
        obj = self._objects.get(check_key(key))
        if obj is None:
            raise NotFound(key)
        return Blob(obj[0], obj[1])

    def head(self, key: str) -> ObjectInfo | None:
        self.requests.add("head")
        obj = self._objects.get(check_key(key))
        return None if obj is None else ObjectInfo(key, len(obj[0]), obj[2])

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Page by page, the items handed on by `chain` without a Python step each: the simulator's
        # end game lists every lease and heartbeat of a thousand workers once per claim.
        return itertools.chain.from_iterable(self._pages(prefix, start_after))

    def _pages(self, prefix: str, start_after: str | None) -> Iterator[Sequence[ObjectInfo]]:
        with self._lock:
            start = start_after if start_after is not None and start_after >= prefix else None
            keys = self._keys.with_prefix(prefix, start if start is not None else prefix, inclusive=start is None)
            snapshot = list(map(self._infos.__getitem__, keys))
        self.requests.add("list")
        for page in range(0, len(snapshot), LIST_PAGE_SIZE):
            if page:
                self.requests.add("list")
            yield snapshot[page : page + LIST_PAGE_SIZE]

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        yield io.BytesIO(self.get(key).data)

    def check_space(self) -> None:
        """No space limit to check here."""

    def put(self, key: str, data: bytes) -> str:
        self.requests.add("put")
        with self._lock:
            return self._write(check_key(key), data)

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as f:
            self.put(key, f.read())

    def put_if_absent(self, key: str, data: bytes) -> str:
        self.requests.add("put_if_absent")
        with self._lock:
            if check_key(key) in self._objects:
                raise PreconditionFailed(key)
            return self._write(key, data)

    def compare_and_swap(self, key: str, data: bytes, etag: str) -> str:
        self.requests.add("compare_and_swap")
        with self._lock:
            obj = self._objects.get(check_key(key))
            if obj is None or obj[1] != etag:
                raise PreconditionFailed(key)
            return self._write(key, data)

    def delete(self, key: str) -> None:
        self.requests.add("delete")
        with self._lock:
            if self._objects.pop(check_key(key), None) is not None:
                del self._infos[key]
                self._keys.remove(key)

    def _write(self, key: str, data: bytes) -> str:
        # A generation number, not a content hash: no two writes ever share an ETag here.
        etag = f"g{next(self._generation)}"
        if key not in self._objects:
            self._keys.add(key)
        self._objects[key] = (bytes(data), etag, self._clock())
        self._infos[key] = ObjectInfo(key, len(data), self._objects[key][2])
        return etag

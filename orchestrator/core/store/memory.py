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


class _SortedEntries:
    """Each key's listing entry, in key order, as sorted blocks: inserts and deletes move one block,
    not every key (a single sorted list of 500,000 keys makes each insert move megabytes), and a
    listing is slices of the blocks, no lookup per key (the simulator's end game lists every lease
    of a thousand workers once per claim)."""

    BLOCK = 1024

    def __init__(self) -> None:
        self._keys: list[list[str]] = []
        self._infos: list[list[ObjectInfo]] = []
        self._firsts: list[str] = []

    def put(self, info: ObjectInfo) -> None:
        key = info.key
        if not self._keys:
            self._keys, self._infos, self._firsts = [[key]], [[info]], [key]
            return
        i = max(bisect.bisect_right(self._firsts, key) - 1, 0)
        keys, infos = self._keys[i], self._infos[i]
        j = bisect.bisect_left(keys, key)
        if j < len(keys) and keys[j] == key:
            infos[j] = info
            return
        keys.insert(j, key)
        infos.insert(j, info)
        self._firsts[i] = keys[0]
        if len(keys) > 2 * self.BLOCK:
            self._keys[i : i + 1] = [keys[: self.BLOCK], keys[self.BLOCK :]]
            self._infos[i : i + 1] = [infos[: self.BLOCK], infos[self.BLOCK :]]
            self._firsts[i : i + 1] = [keys[0], keys[self.BLOCK]]

    def remove(self, key: str) -> None:
        i = max(bisect.bisect_right(self._firsts, key) - 1, 0)
        keys = self._keys[i]
        j = bisect.bisect_left(keys, key)
        del keys[j], self._infos[i][j]
        if keys:
            self._firsts[i] = keys[0]
        else:
            del self._keys[i], self._infos[i], self._firsts[i]

    def with_prefix(self, prefix: str, start: str, *, inclusive: bool) -> list[ObjectInfo]:
        """Entries whose keys start with `prefix` and are >= start (or > start), in order (`start` >= prefix)."""
        # Every key with the prefix sorts below `bound`, except one that goes on with the highest
        # code point: checked one by one past it.
        bound = prefix + "\U0010ffff"
        out: list[ObjectInfo] = []
        blocks = self._keys
        for b in range(max(bisect.bisect_right(self._firsts, start) - 1, 0), len(blocks)):
            keys = blocks[b]
            j = bisect.bisect_left(keys, start) if inclusive else bisect.bisect_right(keys, start)
            k = bisect.bisect_left(keys, bound, j)
            while k < len(keys) and keys[k].startswith(prefix):
                k += 1
            out += self._infos[b][j:k]
            if k < len(keys):
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
        self._entries = _SortedEntries()
        self._lock = threading.Lock()
        self._generation = itertools.count(1)

    # A key found in `_objects` passed `check_key` when it was written: only a key not found is
    # checked (every call checks its key, and a simulated fleet makes millions).

    def get(self, key: str) -> Blob:
        self.requests.add("get")
        obj = self._objects.get(key)
        if obj is None:
            raise NotFound(check_key(key))
        return Blob(obj[0], obj[1])

    def head(self, key: str) -> ObjectInfo | None:
        self.requests.add("head")
        obj = self._objects.get(key)
        if obj is None:
            check_key(key)
            return None
        return ObjectInfo(key, len(obj[0]), obj[2])

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Page by page, the items handed on by `chain` without a Python step each: the simulator's
        # end game lists every lease and heartbeat of a thousand workers once per claim.
        return itertools.chain.from_iterable(self._pages(prefix, start_after))

    def _pages(self, prefix: str, start_after: str | None) -> Iterator[Sequence[ObjectInfo]]:
        with self._lock:
            start = start_after if start_after is not None and start_after >= prefix else None
            snapshot = self._entries.with_prefix(
                prefix, start if start is not None else prefix, inclusive=start is None
            )
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
            return self._write(key if key in self._objects else check_key(key), data)

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as f:
            self.put(key, f.read())

    def put_if_absent(self, key: str, data: bytes) -> str:
        self.requests.add("put_if_absent")
        with self._lock:
            if key in self._objects:
                raise PreconditionFailed(key)
            return self._write(check_key(key), data)

    def compare_and_swap(self, key: str, data: bytes, etag: str) -> str:
        self.requests.add("compare_and_swap")
        with self._lock:
            obj = self._objects.get(key)
            if obj is None or obj[1] != etag:
                raise PreconditionFailed(check_key(key))
            return self._write(key, data)

    def delete(self, key: str) -> None:
        self.requests.add("delete")
        with self._lock:
            if self._objects.pop(key, None) is not None:
                self._entries.remove(key)
            else:
                check_key(key)

    def _write(self, key: str, data: bytes) -> str:
        # A generation number, not a content hash: no two writes ever share an ETag here.
        etag = f"g{next(self._generation)}"
        modified = self._clock()
        self._objects[key] = (bytes(data), etag, modified)
        self._entries.put(ObjectInfo(key, len(data), modified))
        return etag

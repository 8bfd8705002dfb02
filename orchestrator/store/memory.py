"""A run store in process memory: the simulator's store, with the same contract as the others."""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import threading
import time
from typing import BinaryIO, Callable, Iterator

from orchestrator.store.base import (
    LIST_PAGE_SIZE,
    Blob,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    RequestCounter,
    check_key,
)


class MemoryStore:
    """Objects in a dict, keys also kept sorted so listings page like S3's.

    `clock` stamps modification times; the simulator passes its virtual clock.
    """

    def __init__(self, clock: Callable[[], float] = time.time, name: str = "memory"):
        self.uri = f"memory://{name}"
        self.requests = RequestCounter()
        self._clock = clock
        self._objects: dict[str, tuple[bytes, str, float]] = {}
        self._keys: list[str] = []
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
        with self._lock:
            start = bisect.bisect_left(self._keys, prefix)
            if start_after is not None:
                start = max(start, bisect.bisect_right(self._keys, start_after))
            snapshot = []
            for i in range(start, len(self._keys)):
                key = self._keys[i]
                if not key.startswith(prefix):
                    break
                snapshot.append((key, self._objects[key]))
        self.requests.add("list")
        for i, (key, (data, _, modified)) in enumerate(snapshot):
            if i and i % LIST_PAGE_SIZE == 0:
                self.requests.add("list")
            yield ObjectInfo(key, len(data), modified)

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        yield io.BytesIO(self.get(key).data)

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
                del self._keys[bisect.bisect_left(self._keys, key)]

    def _write(self, key: str, data: bytes) -> str:
        # A generation number, not a content hash: no two writes ever share an ETag here.
        etag = f"g{next(self._generation)}"
        if key not in self._objects:
            bisect.insort(self._keys, key)
        self._objects[key] = (bytes(data), etag, self._clock())
        return etag

"""One input source as prepare names it (a file, an object, a table at a version); its batches read ahead."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")
#: Sources read by tables.py, at one pinned version.
TABLE_KINDS = ("iceberg", "delta", "lance", "hf")
#: Sources read as Arrow record batches, whose rows are numbered from 0.
COLUMNAR_KINDS = ("parquet", *TABLE_KINDS)
#: Parquet rows are read this many at a time: memory stays bounded whatever the file's size.
PARQUET_BATCH = 8192


@dataclass(frozen=True)
class SourceFile:
    uri: str  # as the user wrote it (a path, or s3://bucket/key)
    name: str  # the file name: the stem of custom_ids built from file and row
    kind: str  # "jsonl" | "jsonl.gz" | "parquet", or one of TABLE_KINDS
    size: int  # bytes; a table's rows
    etag: str | None = None  # an object store's digest of the content (None for local files); a table's id
    version: str | None = None  # a table's snapshot or version, as read
    columns: tuple[str, ...] = ()  # a table's columns ("name: type"), to say how a schema changed
    since: str | None = None  # read only the rows an Iceberg/Delta table appended after this version (grown.py)


def read_ahead(batches: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Decode the next Parquet batches in a thread (Arrow releases the GIL) while this one is converted."""
    import queue
    import threading

    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        q.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)

    thread = threading.Thread(target=produce, name="parquet-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)

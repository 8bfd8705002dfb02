"""Temporary run files of framed records, for external sorts (prepare's prefix grouping, collect's
input order): each record is a fixed header, whose first fields are the lengths of the byte
strings that follow it, then those byte strings."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator


def write_framed(
    path: str, header: struct.Struct, records: Iterable[tuple[tuple[int, ...], tuple[bytes, ...]]]
) -> None:
    """Each record as (numbers after the lengths, byte strings)."""
    with open(path, "wb", buffering=1 << 20) as f:
        for numbers, blobs in records:
            f.write(header.pack(*(len(b) for b in blobs), *numbers) + b"".join(blobs))


def read_framed(path: str, header: struct.Struct, blobs: int) -> Iterator[tuple[tuple[int, ...], list[bytes]]]:
    """The records of a file `write_framed` wrote with `blobs` byte strings each."""
    with open(path, "rb", buffering=1 << 20) as f:
        while data := f.read(header.size):
            fields = header.unpack(data)
            yield fields[blobs:], [f.read(n) for n in fields[:blobs]]

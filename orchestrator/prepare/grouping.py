"""Prefix grouping for `orch prepare --group-by-prefix`: rows sorted by the start of their request.

A row's prefix is the first `prefix_chars` bytes of its canonical request body (model, system
message, first turn: what an engine's prefix cache shares between rows). Rows are sorted by
(prefix, input position) with an external sort, so memory stays bounded whatever the input size:
rows gather in memory up to RUN_BYTES, are sorted and spilled to a temporary run file, and the
runs are merged at the end. Sorted that way, rows sharing a prefix sit together, and a chunk (a
slice of the sorted rows) holds few prefixes; rows sharing a shorter start sit side by side too.

Each grouped chunk has a positions file (the input position of each of its rows, one a line) so
that collect writes the outputs back in input order; custom_ids are untouched.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from orchestrator.core.framed import read_framed, write_framed
from orchestrator.core.prefix import prefix_hash, prefix_head
from orchestrator.prepare.formats import CHARS_PER_TOKEN, Request

#: Bytes of rows held in memory before a sorted run is spilled to disk.
RUN_BYTES = 64 << 20
#: Per row on disk: line length, position, est. prompt tokens, output budget (the head is the
#: line's own start: found again when the run is read back, not stored twice).
_HEADER = struct.Struct("<Iqqq")
#: The most runs merged at once (each an open file): more are first merged in groups into longer runs.
FAN_IN = 128
#: Python's own cost of a row held in memory (a tuple and two bytes objects), roughly.
_ROW_OVERHEAD = 200

#: (prefix head, input position, request line, est. prompt tokens, output budget). A plain tuple
#: of bytes and ints on purpose: Python's garbage collector stops tracking such tuples, so the
#: rows held for a sorted run cost it nothing (a Request object each made it walk every held row
#: again and again: 10 s of 30 on a million rows).
Row = tuple[bytes, int, bytes, int, int]


class PrefixSorter:
    """Collects (request, input position) pairs; gives them back sorted by (prefix, position)."""

    def __init__(self, prefix_chars: int, run_bytes: int = RUN_BYTES, fan_in: int = FAN_IN):
        self.prefix_bytes = prefix_chars
        self.run_bytes = run_bytes
        self.fan_in = fan_in
        self.dir = tempfile.mkdtemp(prefix="orch-prefix-")
        self.rows: list[Row] = []
        self.held = 0
        self.runs: list[str] = []
        self.spilled = 0
        self.count = 0

    def add(self, request: Request, position: int) -> None:
        line = request.line
        head = prefix_head(line, self.prefix_bytes)
        self.rows.append((head, position, line, request.est_prompt_tokens, request.max_output_tokens))
        self.count += 1
        self.held += len(line) + len(head) + _ROW_OVERHEAD
        if self.held >= self.run_bytes:
            self._spill()

    def _spill(self) -> None:
        self.rows.sort()  # (head, position): positions are unique, so nothing after them is compared
        self._write_run(self.rows)
        self.rows, self.held = [], 0

    def _write_run(self, rows: Iterable[Row]) -> None:
        path = os.path.join(self.dir, f"run-{self.spilled:05d}")
        self.spilled += 1
        records = (((position, tokens, budget), (line,)) for _, position, line, tokens, budget in rows)
        write_framed(path, _HEADER, records)
        self.runs.append(path)

    def _merged(self, runs: list[str]) -> Iterator[Row]:
        return heapq.merge(*(_read_run(p, self.prefix_bytes) for p in runs))

    def sorted_rows(self) -> Iterator[Row]:
        """Every row added, in (prefix, position) order."""
        if not self.runs:
            self.rows.sort()
            yield from self.rows
            return
        if self.rows:
            self._spill()
        while len(self.runs) > self.fan_in:  # a huge input: merge the oldest runs into one longer run
            first, self.runs = self.runs[: self.fan_in], self.runs[self.fan_in :]
            self._write_run(self._merged(first))
            for path in first:
                os.unlink(path)
        yield from self._merged(self.runs)

    def discard(self) -> None:
        self.rows = []
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def _read_run(path: str, prefix_bytes: int) -> Iterator[Row]:
    for (position, prompt_tokens, output_tokens), (line,) in read_framed(path, _HEADER, 1):
        yield prefix_head(line, prefix_bytes), position, line, prompt_tokens, output_tokens


@dataclass
class PrefixStats:
    """One chunk's prefix groups, as the manifest records them. Rows come in prefix order, so a
    group is a run of equal heads; only a chunk's first and last groups can continue in another chunk."""

    groups: int = 0
    shared_tokens: int = 0
    first: str | None = None
    last_head: bytes | None = None
    positions: list[int] = field(default_factory=list)

    def add(self, head: bytes, position: int) -> None:
        self.positions.append(position)
        if head == self.last_head:
            # The head is shared; the real shared prefix may be longer (an estimate from below).
            self.shared_tokens += len(head) // CHARS_PER_TOKEN
            return
        self.groups += 1
        self.last_head = head
        if self.first is None:
            self.first = prefix_hash(head)

    def edge_prefixes(self) -> list[str]:
        """Hashes of the chunk's first and last groups (one when they are the same)."""
        if self.first is None or self.last_head is None:
            return []
        last = prefix_hash(self.last_head)
        return [self.first] if last == self.first else [self.first, last]

    def positions_file(self) -> bytes:
        return "".join(f"{p}\n" for p in self.positions).encode()

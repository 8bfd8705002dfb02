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
from collections.abc import Iterator
from dataclasses import dataclass, field

from orchestrator.core.framed import read_framed, write_framed
from orchestrator.core.prefix import prefix_hash, prefix_head
from orchestrator.prepare.formats import CHARS_PER_TOKEN, Request

#: Bytes of rows held in memory before a sorted run is spilled to disk.
RUN_BYTES = 64 << 20
#: Per row on disk: head length, line length, position, est. prompt tokens, output budget.
_HEADER = struct.Struct("<IIqqq")
#: Python's own cost of a row held in memory (tuple, bytes objects, Request), roughly.
_ROW_OVERHEAD = 300


Row = tuple[bytes, int, Request]  # (prefix head, input position, request)


class PrefixSorter:
    """Collects (request, input position) pairs; gives them back sorted by (prefix, position)."""

    def __init__(self, prefix_chars: int, run_bytes: int = RUN_BYTES):
        self.prefix_bytes = prefix_chars
        self.run_bytes = run_bytes
        self.dir = tempfile.mkdtemp(prefix="orch-prefix-")
        self.rows: list[Row] = []
        self.held = 0
        self.runs: list[str] = []
        self.count = 0

    def add(self, request: Request, position: int) -> None:
        head = prefix_head(request.line, self.prefix_bytes)
        self.rows.append((head, position, request))
        self.count += 1
        self.held += len(request.line) + len(head) + _ROW_OVERHEAD
        if self.held >= self.run_bytes:
            self._spill()

    def _spill(self) -> None:
        self.rows.sort()  # (head, position): positions are unique, so requests are never compared
        path = os.path.join(self.dir, f"run-{len(self.runs):05d}")
        records = (
            ((position, r.est_prompt_tokens, r.max_output_tokens), (head, r.line)) for head, position, r in self.rows
        )
        write_framed(path, _HEADER, records)
        self.runs.append(path)
        self.rows, self.held = [], 0

    def sorted_rows(self) -> Iterator[Row]:
        """Every row added, in (prefix, position) order."""
        if not self.runs:
            self.rows.sort()
            yield from self.rows
            return
        if self.rows:
            self._spill()
        yield from heapq.merge(*(_read_run(p) for p in self.runs))

    def discard(self) -> None:
        self.rows = []
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def _read_run(path: str) -> Iterator[Row]:
    for (position, prompt_tokens, output_tokens), (head, line) in read_framed(path, _HEADER, 2):
        yield head, position, Request("", line, prompt_tokens, output_tokens)


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

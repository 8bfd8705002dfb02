"""Output lines back into input order when chunks hold rows in prefix order (`--group-by-prefix`).

Each chunk's positions file is checked before it is trusted (runview/positions.py). Then an
external merge: each chunk's lines (and the rows set aside at prepare) are sorted by input
position and spilled to a temporary run file; at the end the runs are merged, a line at a time,
into the writer. Memory stays bounded by one chunk; at most MAX_OPEN runs are read at once
(more are first merged into larger runs).
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from orchestrator.collect.scratch import scratch_dir
from orchestrator.core.framed import read_framed, write_framed
from orchestrator.core.lines import BatchOutputLine

MAX_OPEN = 200
#: A line without a position (recorded by an older prepare) goes after every positioned one.
_LAST = 2**62
_HEADER = struct.Struct("<Iqq")  # line length, position, arrival (ties keep arrival order)

Entry = tuple[int, int, bytes]


class LineSink(Protocol):
    def add(self, line: BatchOutputLine, position: int | None = None) -> None: ...


class InputOrder:
    """A LineSink that writes to `write` in input-position order once closed (with each line's
    position, None for a line that came without one)."""

    def __init__(self, write: Callable[[BatchOutputLine, int | None], None]):
        self.write = write
        self.dir = scratch_dir()  # a killed collect's is removed by the next one
        self.lines: list[Entry] = []
        self.runs: list[str] = []
        self.arrival = 0

    def add(self, line: BatchOutputLine, position: int | None = None) -> None:
        self.lines.append((_LAST if position is None else position, self.arrival, line.to_json()))
        self.arrival += 1

    def end_run(self) -> None:
        """The lines so far become one sorted run on disk."""
        if self.lines:
            self.lines.sort()
            self.runs.append(self._spill(iter(self.lines)))
            self.lines = []

    def _spill(self, entries: Iterator[Entry]) -> str:
        path = os.path.join(self.dir, f"run-{len(os.listdir(self.dir)):06d}")
        write_framed(path, _HEADER, (((position, arrival), (data,)) for position, arrival, data in entries))
        return path

    def __enter__(self) -> InputOrder:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None:
                self.end_run()
                runs = self.runs
                while len(runs) > MAX_OPEN:
                    runs = [
                        self._spill(heapq.merge(*map(_read, runs[i : i + MAX_OPEN])))
                        for i in range(0, len(runs), MAX_OPEN)
                    ]
                for position, _arrival, data in heapq.merge(*map(_read, runs)):
                    self.write(BatchOutputLine.model_validate_json(data), None if position == _LAST else position)
        finally:
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)


def _read(path: str) -> Iterator[Entry]:
    for (position, arrival), (data,) in read_framed(path, _HEADER, 1):
        yield position, arrival, data

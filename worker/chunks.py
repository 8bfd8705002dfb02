"""A chunk a worker has opened: its lease and checkpoints, its input on local disk, its finished rows."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from orchestrator.core.protocol.checkpoints import ChunkJob
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.protocol.leases import LeaseKeeper
from orchestrator.core.records import ManifestEntry
from orchestrator.core.spec import SamplingSpec
from orchestrator.core.store import Store
from worker.requests import parse_request
from worker.wire import EngineRequest, RowResult, error_line


@dataclass
class OpenChunk:
    """A chunk in the engine: its lease and checkpoints, and the rows finished but not flushed yet."""

    entry: ManifestEntry
    job: ChunkJob
    keeper: LeaseKeeper
    last_flush: float
    skip: set[int]  # rows flushed by an earlier pass
    source: IO[bytes]  # the chunk's input lines, copied to local disk when the chunk was opened
    buffer: list[RowResult] = field(default_factory=list)
    side_errors: list[RowResult] = field(default_factory=list)
    outstanding: int = 0  # handed to the engine, not finished
    fed: bool = False  # every line read: handed to the engine or set aside as an error row
    rows_done: int = 0
    dropped: bool = False  # no longer ours (lease lost, completed, given back); its source is closed

    @property
    def careful(self) -> bool:
        """A holder of this chunk died before us: work it carefully (core/protocol/crashes.py)."""
        return self.keeper.held.lease.crashes > 0

    def requests(self, sampling: SamplingSpec) -> Iterator[EngineRequest]:
        """The chunk's lines as engine requests, streamed; bad lines, and rows that killed two
        holders (core/protocol/crashes.py), go to `side_errors` instead.

        The chunk can be dropped while this generator is suspended at its `yield` (a lease lost
        at the engine step in between): it then stops before reading the closed source again."""
        entry, skip = self.entry, self.skip
        poison = set(self.keeper.held.lease.poison)
        if self.dropped:
            return
        for index, line in enumerate(self.source):
            if index in skip:
                continue
            parsed = parse_request(line, index, sampling)
            if isinstance(parsed, EngineRequest) and index in poison:
                parsed = crashed_row(parsed)
            if isinstance(parsed, EngineRequest):
                yield parsed
                if self.dropped:
                    return
            else:
                parsed.chunk = entry.chunk
                self.side_errors.append(parsed)


def copy_input(store: Store, layout: RunLayout, chunk: str) -> IO[bytes]:
    """The chunk's input on local disk (deleted when closed): feeding it needs no store."""
    local = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the chunk's OpenChunk, closed when it is dropped
    try:
        with store.open(layout.chunk(chunk)) as f:
            while block := f.read(1 << 20):
                local.write(block)
    except BaseException:
        local.close()
        raise
    local.seek(0)
    return local


def crashed_row(request: EngineRequest) -> RowResult:
    """The answer to a row in flight during two deaths of its worker: an error row, never run again."""
    message = (
        "the worker process died twice while this row was being generated (the second time with this row "
        "alone in the engine), so it is not run again; check its parameters and prompt, and the worker logs"
    )
    line = error_line(request.custom_id, "worker_crashed", message, status=500)
    return RowResult(request.index, request.custom_id, line, 0, 0, True)

"""A chunk a worker has opened: its lease and checkpoints, its input on local disk, its finished rows."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

from orchestrator.core.layout import RunLayout
from orchestrator.core.prefix import feed_order
from orchestrator.core.protocol.checkpoints import ChunkJob
from orchestrator.core.protocol.crashes import poison_evidence
from orchestrator.core.protocol.leases import HeldLease, LeaseKeeper
from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.records import ManifestEntry
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import SamplingSpec
from orchestrator.core.store import Store
from worker.requests import parse_request
from worker.totals import Totals
from worker.wire import EngineRequest, RowResult, error_line


@dataclass
class OpenChunk:
    """A chunk in the engine: its lease and checkpoints, and the rows finished but not flushed yet."""

    entry: ManifestEntry
    job: ChunkJob[RowResult]
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

    def requests(
        self,
        sampling: SamplingSpec,
        unknown_fields: str = "error",
        note_ignored: Callable[[tuple[str, ...]], None] | None = None,
        schemas: RunSchemas | None = None,
    ) -> Iterator[EngineRequest]:
        """The chunk's lines as engine requests, streamed; bad lines, and poison rows (each alone in
        the engine of two holders that died soon after starting it: core/protocol/crashes.py), go
        to `side_errors` instead.

        Lines are read ORDER_WINDOW at a time and handed over by prompt prefix (rows sharing one
        together, so the engine's prefix cache serves them), the longest first within a prefix (a
        short tail). A careful chunk keeps its order (crash groups follow row order).

        The chunk can be dropped while this generator is suspended at its `yield` (a lease lost
        at the engine step in between): it then stops before reading the closed source again."""
        entry, skip = self.entry, self.skip
        lease = self.keeper.held.lease
        poison = set(lease.poison)
        if self.dropped:
            return
        for window in _windows(self.source, skip, 1 if self.careful else ORDER_WINDOW):
            for index, line in window:
                parsed = parse_request(line, index, sampling, unknown_fields, schemas)
                if isinstance(parsed, EngineRequest) and parsed.ignored and note_ignored is not None:
                    note_ignored(parsed.ignored)
                if isinstance(parsed, EngineRequest) and index in poison:
                    parsed = crashed_row(parsed, poison_evidence(lease, index))
                if isinstance(parsed, EngineRequest):
                    yield parsed
                    if self.dropped:
                        return
                else:
                    parsed.chunk = entry.chunk
                    self.side_errors.append(parsed)
            if self.dropped:
                return


#: Lines of a chunk ordered by prefix at a time: bounds the lines held in memory.
ORDER_WINDOW = 4096


def _windows(source: IO[bytes], skip: set[int], size: int) -> Iterator[list[tuple[int, bytes]]]:
    """The lines not in `skip`, `size` at a time, each window in prefix order (longest first within one)."""
    window: list[tuple[int, bytes]] = []
    for index, line in enumerate(source):
        if index in skip:
            continue
        window.append((index, line))
        if len(window) >= size:
            yield _by_prefix(window)
            window = []
    if window:
        yield _by_prefix(window)


def _by_prefix(window: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    if len(window) > 1:
        window = [window[i] for i in feed_order([line for _, line in window])]
    return window


class ChunksInHand:
    """The chunks a worker holds: those open in the engine (oldest first) and the leases behind them.

    `lock` (the worker's) guards them and the totals' chunk in hand: the heartbeat thread renews
    the leases in `keepers` and publishes the totals."""

    def __init__(self, totals: Totals, lock: threading.Lock):
        self.totals = totals
        self.lock = lock
        self.open: dict[str, OpenChunk] = {}
        #: The leases we hold, renewed in the background.
        self.keepers: dict[str, LeaseKeeper] = {}
        #: Leases taken whose chunk the store did not let us open yet.
        self.unopened: list[HeldLease] = []

    def note_ignored(self, names: tuple[str, ...]) -> None:
        """A request's body fields ignored under `requests.unknown_fields: warn`: counted in the totals."""
        with self.lock:
            self.totals.ignored(names)

    def hold(self, chunk: str, keeper: LeaseKeeper) -> None:
        with self.lock:
            self.keepers[chunk] = keeper

    def add(self, chunk: OpenChunk) -> None:
        """A chunk opened: in the engine from now on, and the heartbeat's chunk in hand."""
        with self.lock:
            self.open[chunk.entry.chunk] = chunk
            self.totals.chunk, self.totals.chunk_rows = chunk.entry.chunk, chunk.entry.rows
            self.totals.chunk_rows_done = len(chunk.skip)

    def drop(self, chunk: str) -> OpenChunk | None:
        """No longer ours (lease lost, completed, given back): its lease is no longer renewed."""
        with self.lock:
            self.keepers.pop(chunk, None)
            active = self.open.pop(chunk, None)
            if active is not None:
                active.dropped = True  # the feed may be suspended in its lines: see OpenChunk.requests
                active.source.close()
            if self.totals.chunk == chunk:
                # The heartbeat shows the chunk still in hand, if any.
                other = next(iter(self.open.values()), None)
                self.totals.chunk = other.entry.chunk if other else None
                self.totals.chunk_rows = other.entry.rows if other else 0
                self.totals.chunk_rows_done = (len(other.skip) + other.rows_done) if other else 0
        return active

    def rows_in_hand(self) -> tuple[int, int]:
        """(rows checkpointed, rows answered and held in memory) over the chunks in hand: the
        heartbeat's `rows_saved` and `rows_unsaved`. The caller holds the lock (the heartbeat
        thread, reading the totals under it): the engine loop adds and drops chunks under it."""
        chunks = list(self.open.values())
        saved = sum(a.job.rows_done for a in chunks)
        return saved, sum(len(a.buffer) + len(a.side_errors) for a in chunks)

    def drop_all(self) -> list[OpenChunk]:
        return [a for a in (self.drop(c) for c in list(self.open)) if a is not None]

    def give_back(self, active: OpenChunk) -> None:
        """Drop the chunk and release its lease: free for others at once, not at its expiry."""
        self.drop(active.entry.chunk)
        with contextlib.suppress(Exception):
            active.keeper.release()

    def give_back_all(self) -> None:
        """Every lease we hold released, those of chunks not opened yet included."""
        for active in self.drop_all():
            with contextlib.suppress(Exception):
                active.keeper.release()
        with self.lock:
            keepers = list(self.keepers.values())
            self.keepers.clear()
        for keeper in keepers:
            with contextlib.suppress(Exception):
                keeper.release()

    def route(self, finished: list[RowResult]) -> list[RowResult]:
        """Finished rows to the buffers of their chunks; returns those kept (rows of a chunk we lost are dropped)."""
        kept = []
        for row in finished:
            active = self.open.get(row.chunk) if row.chunk is not None else None
            if active is None:
                continue
            active.outstanding -= 1
            active.rows_done += 1
            active.buffer.append(row)
            kept.append(row)
        return kept

    def room_for_another(self, capacity: int, chunks_in_engine: int) -> bool:
        """The engine has room the chunks in it cannot fill: time to open the next."""
        if any(a.careful and a.outstanding > 0 for a in self.open.values()):
            return False  # a careful chunk is alone in the engine
        in_engine = [a.outstanding for a in self.open.values() if a.outstanding > 0]
        return len(in_engine) < chunks_in_engine and sum(in_engine) < capacity


def open_chunk(
    store: Store,
    layout: RunLayout,
    entry: ManifestEntry,
    keeper: LeaseKeeper,
    output_format: str,
    clock: Callable[[], float],
) -> OpenChunk:
    """Steps 1-2 of a chunk once its lease is taken: resume from its checkpoints, copy its input."""
    job = ChunkJob(store, layout, keeper, part_codec(output_format, entry.chunk), clock, chunk_rows=entry.rows)
    point = job.resume()
    source = copy_input(store, layout, entry.chunk)
    return OpenChunk(entry, job, keeper, last_flush=clock(), skip=point.done_rows, source=source)


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


def crashed_row(request: EngineRequest, evidence: str) -> RowResult:
    """The answer to a poison row: an error row naming the evidence against it, never run again."""
    message = f"{evidence}, so it is not run again; check its parameters and prompt, and the worker logs"
    line = error_line(request.custom_id, "worker_crashed", message, status=500)
    return RowResult(request.index, request.custom_id, line, 0, 0, True)

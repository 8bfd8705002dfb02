"""A worker's pass over one chunk: resume from checkpointed parts, flush new parts, finish with the done marker.

Outputs of a chunk are written as parts, `outputs/<chunk>/<holder>-<seq>.<ext>`, each flushed
while its writer held the lease. The done marker is the only truth: it lists the parts that make
up the chunk, and nothing reads a part it does not list.

Resuming (any worker, after any crash):
1. List the chunk's parts, oldest first, and read the row indices each one holds.
2. Keep a part only if none of its rows is already covered by a kept part. Overlaps can only come
   from a worker that lost its lease and flushed once more before noticing; dropping the whole
   later part (its rows are simply done again) keeps every row exactly once.
3. Work on the rows no kept part covers; the marker lists the kept parts plus the new ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.protocol.leases import Clock, LeaseKeeper
from orchestrator.core.records import ChunkStats, DoneMarker, PartRef
from orchestrator.core.store import PreconditionFailed, Store


@dataclass(frozen=True)
class RowStat:
    """What the protocol needs to know of one output row (the engine's results carry more)."""

    index: int
    error: bool
    tokens_in: int
    tokens_out: int


class OutputRow(Protocol):
    """What ChunkJob reads of a row it flushes: its place in the chunk, whether it failed, its tokens."""

    @property
    def index(self) -> int: ...
    @property
    def error(self) -> bool: ...
    @property
    def tokens_in(self) -> int: ...
    @property
    def tokens_out(self) -> int: ...


RowT = TypeVar("RowT", bound=OutputRow, contravariant=True)


class PartCodec(Protocol[RowT]):
    """Turns output rows into a part's bytes and back into row stats (JSONL, Parquet, or the simulator's)."""

    @property
    def ext(self) -> str: ...

    def encode(self, rows: Sequence[RowT]) -> bytes: ...

    def decode(self, data: bytes) -> list[RowStat]: ...


class IncompleteChunk(RuntimeError):
    """The rows flushed for a chunk do not cover it: a bug in the caller, never a marker."""


@dataclass
class ResumePoint:
    parts: list[PartRef] = field(default_factory=list)
    done_rows: set[int] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0


def load_resume_point(store: Store, layout: RunLayout, chunk: str, codec: PartCodec[Any]) -> ResumePoint:
    """What is already flushed for the chunk (see the module docstring for the rules)."""
    point = ResumePoint()
    infos = sorted(store.list(layout.outputs_prefix(chunk)), key=lambda o: (o.modified, o.key))
    for info in infos:
        data = store.get(info.key).data
        rows = codec.decode(data)
        indices = {r.index for r in rows}
        if len(indices) != len(rows) or indices & point.done_rows:
            point.dropped.append(info.key)
            continue
        errors = sum(r.error for r in rows)
        point.parts.append(PartRef(key=info.key, rows=len(rows), errors=errors, bytes=len(data), sha256=_sha256(data)))
        point.done_rows |= indices
        point.errors += errors
        point.tokens_in += sum(r.tokens_in for r in rows)
        point.tokens_out += sum(r.tokens_out for r in rows)
    return point


class ChunkJob(Generic[RowT]):
    """Checkpoints and completion of one chunk by one lease holder."""

    def __init__(
        self,
        store: Store,
        layout: RunLayout,
        keeper: LeaseKeeper,
        codec: PartCodec[RowT],
        clock: Clock,
        *,
        chunk_rows: int,
    ):
        self.store = store
        self.layout = layout
        self.keeper = keeper
        self.codec = codec
        self.clock = clock
        self.chunk = keeper.chunk
        self.chunk_rows = chunk_rows
        self.started_at = clock()
        self.point = ResumePoint()
        self._seq = 0

    @property
    def holder(self) -> str:
        return self.keeper.held.lease.holder

    @property
    def rows_done(self) -> int:
        return len(self.point.done_rows)

    def resume(self) -> ResumePoint:
        self.point = load_resume_point(self.store, self.layout, self.chunk, self.codec)
        # Never reuse a part name of ours from an earlier pass over this chunk.
        self._seq = max(
            (_part_seq(key, self.holder) for key in [*(p.key for p in self.point.parts), *self.point.dropped]),
            default=0,
        )
        return self.point

    def checkpoint(self, rows: Sequence[RowT]) -> PartRef | None:
        """Flush finished rows as one part. Renews the lease first: raises LeaseLost if it is gone."""
        self.keeper.renew()
        if not rows:
            return None
        indices = {r.index for r in rows}
        if len(indices) != len(rows) or indices & self.point.done_rows:
            raise IncompleteChunk(f"{self.chunk}: a row was flushed twice")
        data = self.codec.encode(rows)
        self._seq += 1
        key = self.layout.output_part(self.chunk, self.holder, self._seq, self.codec.ext)
        self.store.put(key, data)
        errors = sum(r.error for r in rows)
        ref = PartRef(key=key, rows=len(rows), errors=errors, bytes=len(data), sha256=_sha256(data))
        self.point.parts.append(ref)
        self.point.done_rows |= indices
        self.point.errors += errors
        self.point.tokens_in += sum(r.tokens_in for r in rows)
        self.point.tokens_out += sum(r.tokens_out for r in rows)
        return ref

    def complete(self, *, worker: str, model: str, spec_hash: str, accelerator: str | None) -> DoneMarker | None:
        """Write the done marker (create-if-absent). Returns None if another worker finished first.

        1. Every row of the chunk must be in a listed part.
        2. Renew the lease: if it is gone, someone else owns the chunk now; stop.
        3. Create the marker; then the stats entry `status` reads from listings; then drop the lease.
        """
        if len(self.point.done_rows) != self.chunk_rows or self.point.done_rows != set(range(self.chunk_rows)):
            raise IncompleteChunk(f"{self.chunk}: {len(self.point.done_rows)} of {self.chunk_rows} rows flushed")
        self.keeper.renew()
        marker = DoneMarker(
            chunk=self.chunk,
            parts=self.point.parts,
            rows=self.chunk_rows,
            errors=self.point.errors,
            worker=worker,
            holder=self.holder,
            accelerator=accelerator,
            model=model,
            spec_hash=spec_hash,
            started_at=self.started_at,
            finished_at=self.clock(),
            tokens_in=self.point.tokens_in,
            tokens_out=self.point.tokens_out,
            output_format="parquet" if self.codec.ext == "parquet" else "jsonl",
        )
        try:
            self.store.put_if_absent(self.layout.done(self.chunk), marker.to_bytes())
        except PreconditionFailed:
            return None
        self.store.put(self.layout.stats(self.chunk, marker.stats().key_values(), marker.finished_at), b"")
        # The marker supersedes the lease; deleting it keeps lease listings short.
        self.store.delete(self.layout.lease(self.chunk))
        return marker


def read_chunk_stats(store: Store, layout: RunLayout) -> dict[str, tuple[float, ChunkStats]]:
    """chunk -> (finished_at, its stats), from listings alone (one request per 1,000 chunks)."""
    out: dict[str, tuple[float, ChunkStats]] = {}
    for info in store.list(layout.stats_prefix):
        try:
            finished, chunk, encoded = layout.parse_stats(info.key)
            out[chunk] = (finished, ChunkStats.from_key(encoded))
        except ValueError:
            continue  # not a stats key of this version
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _part_seq(key: str, holder: str) -> int:
    """The sequence number of a part this holder wrote (`<holder>-<seq>.<ext>`), else 0."""
    name = key.rsplit("/", 1)[-1]
    if not name.startswith(holder + "-"):
        return 0
    seq = name[len(holder) + 1 :].split(".", 1)[0]
    return int(seq) if seq.isdigit() else 0

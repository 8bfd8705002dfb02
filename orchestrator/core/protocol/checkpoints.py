"""A worker's pass over one chunk: resume from checkpointed parts, flush new parts, finish with the done marker.

Outputs of a chunk are written as parts, `outputs/<chunk>/<holder>-<seq>.<rows>rows.<ext>`, each flushed
while its writer held the lease. The done marker is the only truth: it lists the parts that make
up the chunk, and nothing reads a part it does not list.

Resuming (any worker, after any crash):
1. List the chunk's parts, oldest first, and read the row indices each one holds.
2. Keep a part only if none of its rows is already covered by a kept part. Overlaps can only come
   from a worker that lost its lease and flushed once more before noticing; dropping the whole
   later part (its rows are simply done again) keeps every row exactly once. A part that does
   not decode (truncated, or an object orch did not write) is dropped the same way, named in a
   warning.
3. Work on the rows no kept part covers; the marker lists the kept parts plus the new ones.

Redoing a chunk (`orch redo`, `redo_chunk`) is the reverse of completing it, under the chunk's
lease so that no worker resumes from parts being removed: parts first, then stats, the marker
last, then the lease is given back and any worker takes the chunk at once.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from orchestrator.core.errors import ChunkBusy, CorruptRecord
from orchestrator.core.layout import RunLayout, part_rows
from orchestrator.core.protocol.leases import Clock, LeaseKeeper, acquire, read_lease, release
from orchestrator.core.records import ChunkStats, DoneMarker, PartRef, read_record
from orchestrator.core.store import NotFound, ObjectInfo, PreconditionFailed, Store, StoreError, ignore_stray


@dataclass(frozen=True)
class RowStat:
    """What the protocol needs to know of one output row (the engine's results carry more)."""

    index: int
    error: bool
    tokens_in: int
    tokens_out: int
    #: Prompt tokens the engine's prefix cache held (part of tokens_in).
    tokens_cached: int = 0


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
    @property
    def tokens_cached(self) -> int: ...


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
    tokens_cached: int = 0

    def count(self, rows: Sequence[OutputRow]) -> None:
        """Add the rows' error and token counts (one pass: a flush of a large chunk counts many rows)."""
        errors = tokens_in = tokens_out = tokens_cached = 0
        for r in rows:
            errors += r.error
            tokens_in += r.tokens_in
            tokens_out += r.tokens_out
            tokens_cached += r.tokens_cached
        self.errors += errors
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.tokens_cached += tokens_cached


def load_resume_point(store: Store, layout: RunLayout, chunk: str, codec: PartCodec[Any]) -> ResumePoint:
    """What is already flushed for the chunk (see the module docstring for the rules)."""
    point = ResumePoint()
    infos = sorted(store.list(layout.outputs_prefix(chunk)), key=lambda o: (o.modified, o.key))
    for info in infos:
        try:
            blob = store.get(info.key)
        except NotFound:
            continue  # removed since the listing (`orch redo`)
        data = blob.data
        try:
            rows = codec.decode(data)
        except Exception as e:  # JSON, pydantic or Parquet errors alike: the part cannot be trusted
            ignore_stray(
                info.key, f"not a readable output part ({type(e).__name__}: {str(e)[:120]}); its rows run again"
            )
            point.dropped.append(info.key)
            continue
        indices = {r.index for r in rows}
        if len(indices) != len(rows) or indices & point.done_rows:
            point.dropped.append(info.key)
            continue
        errors = sum(r.error for r in rows)
        point.parts.append(
            PartRef(key=info.key, rows=len(rows), errors=errors, bytes=len(data), sha256=_sha256(data), etag=blob.etag)
        )
        point.done_rows |= indices
        point.count(rows)
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
        self._marker: DoneMarker | None = None

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
        key = self.layout.output_part(self.chunk, self.holder, self._seq, self.codec.ext, rows=len(rows))
        etag = self.store.put(key, data)
        errors = sum(r.error for r in rows)
        ref = PartRef(key=key, rows=len(rows), errors=errors, bytes=len(data), sha256=_sha256(data), etag=etag)
        self.point.parts.append(ref)
        self.point.done_rows |= indices
        self.point.count(rows)
        return ref

    def complete(self, *, worker: str, model: str, spec_hash: str, accelerator: str | None) -> DoneMarker | None:
        """Write the done marker (create-if-absent). Returns None if another worker finished first.

        1. Every row of the chunk must be in a listed part.
        2. Renew the lease: if it is gone, someone else owns the chunk now; stop.
        3. Create the marker; then the stats entry `status` reads from listings; then drop the lease.
        Safe to call again after a StoreUnavailable: the same marker is written, and our own
        earlier marker counts as written. Steps after the marker are a cache and a tidy-up: when
        the store fails them, the marker still stands (status reads it; the next taker of the
        lease finds the marker and deletes the lease).
        """
        if len(self.point.done_rows) != self.chunk_rows or self.point.done_rows != set(range(self.chunk_rows)):
            raise IncompleteChunk(f"{self.chunk}: {len(self.point.done_rows)} of {self.chunk_rows} rows flushed")
        self.keeper.renew()
        marker = self._marker or DoneMarker(
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
            tokens_cached=self.point.tokens_cached,
            output_format="parquet" if self.codec.ext == "parquet" else "jsonl",
        )
        self._marker = marker
        data = marker.to_bytes()
        try:
            self.store.put_if_absent(self.layout.done(self.chunk), data)
        except PreconditionFailed:
            with contextlib.suppress(NotFound):
                if self.store.get(self.layout.done(self.chunk)).data == data:
                    return self._tidy_up(marker)  # our own, from an attempt whose answer was lost
            return None
        return self._tidy_up(marker)

    def _tidy_up(self, marker: DoneMarker) -> DoneMarker:
        with contextlib.suppress(StoreError):
            self.store.put(self.layout.stats(self.chunk, marker.stats().key_values(), marker.finished_at), b"")
            # The marker supersedes the lease; deleting it keeps lease listings short.
            self.store.delete(self.layout.lease(self.chunk))
        return marker


def read_chunk_stats(store: Store, layout: RunLayout) -> dict[str, tuple[float, ChunkStats]]:
    """chunk -> (finished_at, its stats), from listings alone (one request per 1,000 chunks).

    A cache of the markers: callers count only chunks whose marker exists."""
    out: dict[str, tuple[float, ChunkStats]] = {}
    for info in store.list(layout.stats_prefix):
        try:
            finished, chunk, encoded = layout.parse_stats(info.key)
            out[chunk] = (finished, ChunkStats.from_key(encoded))
        except ValueError:
            ignore_stray(info.key, "not a stats entry of this orch version")
    return out


def checkpointed_rows(store: Store, layout: RunLayout, unfinished: set[str]) -> dict[str, int]:
    """chunk -> rows checkpointed so far, for the `unfinished` chunks (no marker yet), from one
    listing of the outputs (one request per 1,000 parts): each part's name carries its row count.
    What `status` shows between checkpoints and after a cancel; a progress figure, not a truth
    (a part a resume drops is counted too, so a chunk is capped at its rows by the caller)."""
    out: dict[str, int] = {}
    if not unfinished:
        return out
    for info in store.list(layout.outputs_root):
        chunk = layout.chunk_of(info.key, layout.outputs_root)
        rows = part_rows(info.key)
        if chunk in unfinished and rows is not None:
            out[chunk] = out.get(chunk, 0) + rows
    return out


@dataclass
class RedoReport:
    chunk: str
    had_marker: bool
    parts_removed: int
    stats_removed: int


def redo_chunk(store: Store, layout: RunLayout, chunk: str, *, ttl: float, now: float, holder: str) -> RedoReport:
    """Drop a chunk's marker, stats and parts so that the fleet runs it again (see the module docstring).

    1. Take the chunk's lease (a live worker's lease on a chunk without a marker refuses: the
       chunk is being done now). From here no worker can resume it.
    2. Delete its parts, then its stats entries, then its marker (last: a redo that dies half-way
       leaves a marker whose parts are missing, which status reports as damaged, never a chunk
       resumed from the parts being removed).
    3. Give the lease back: the chunk is free for any worker at once.
    """
    marker_key = layout.done(chunk)
    had_marker = store.head(marker_key) is not None
    held = acquire(
        store, layout, chunk, worker="redo", holder=holder, ttl=ttl, now=now, may_take=lambda _lease: had_marker
    )
    if held is None:
        try:
            current = read_lease(store, layout, chunk)
        except CorruptRecord:
            current = None
        who = f"{current[0].holder} (lease until {current[0].expires_at:.0f})" if current else "another process"
        raise ChunkBusy(
            f"{chunk} has no marker and is being worked on by {who}: nothing to redo",
            where=layout.lease(chunk),
            hint="wait for the chunk to finish, then redo it if it is damaged",
        )
    parts = [info.key for info in store.list(layout.outputs_prefix(chunk))]
    for key in parts:
        store.delete(key)
    stats = []
    for info in store.list(layout.stats_prefix):
        with contextlib.suppress(ValueError):
            if layout.parse_stats(info.key)[1] == chunk:
                stats.append(info.key)
    for key in stats:
        store.delete(key)
    store.delete(marker_key)
    release(store, layout, held, now=now)
    return RedoReport(chunk, had_marker, len(parts), len(stats))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _part_seq(key: str, holder: str) -> int:
    """The sequence number of a part this holder wrote (`<holder>-<seq>.<ext>`), else 0."""
    name = key.rsplit("/", 1)[-1]
    if not name.startswith(holder + "-"):
        return 0
    seq = name[len(holder) + 1 :].split(".", 1)[0]
    return int(seq) if seq.isdigit() else 0


def find_damage(store: Store, layout: RunLayout, chunks: Iterable[str], *, threads: int = 16) -> dict[str, str]:
    """Chunks whose marker is corrupt or whose parts no longer match it: chunk -> what is wrong.

    What `status` and `orch watch` check before they call a run complete (collect checks every
    byte again as it reads):
    1. Read every marker (one GET each, `threads` at a time).
    2. List the run's output parts once (one request per 1,000) for their sizes and, on S3, ETags.
    3. A part that is missing, or whose size or ETag differs from what its marker recorded, is
       damage. Where no ETag is known on both sides (a local store, markers of older orch), the
       part is read and its SHA-256 compared.
    """
    chunks = list(chunks)

    def marker(chunk: str) -> DoneMarker | str | None:
        try:
            found = read_record(store, layout.done(chunk), DoneMarker)
        except CorruptRecord as e:
            return f"its marker is corrupt ({e.message})"
        return found[0] if found is not None else None

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(chunks)))) as pool:
        markers = dict(zip(chunks, pool.map(marker, chunks), strict=True))
    listed = {info.key: info for info in store.list(f"{layout.root}outputs/")}
    damage: dict[str, str] = {}
    for chunk, found in markers.items():
        if isinstance(found, str):
            damage[chunk] = found
            continue
        for part in found.parts if found is not None else ():
            problem = _part_problem(store, part, listed.get(part.key))
            if problem:
                damage[chunk] = f"{part.key} {problem}"
                break
    return damage


def _part_problem(store: Store, part: PartRef, info: ObjectInfo | None) -> str | None:
    if info is None:
        return "is missing"
    if info.size != part.bytes:
        return f"has {info.size} bytes where its marker says {part.bytes}"
    if info.etag is not None and part.etag is not None:
        return None if info.etag.strip('"') == part.etag.strip('"') else "changed after its marker was written"
    try:
        data = store.get(part.key).data
    except NotFound:
        return "is missing"
    return None if _sha256(data) == part.sha256 else "does not match the checksum in its marker"

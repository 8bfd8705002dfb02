"""Chunk leases: create-if-absent to take a free chunk, compare-and-swap to renew, release or take over.

A lease names the worker process (`holder`) that may write a chunk's outputs until `expires_at`.
Correctness never rests on a lease alone: the done marker is written create-if-absent and lists
exactly the parts it is made of, so a worker that lost its lease without noticing only leaves
garbage behind. Leases are about not doing work twice, and about knowing when to stop.

Expiry is judged on the store's clock (core/protocol/clocks.py): a lease that looks expired by
the reader's clock (`expires_at`, by the writer's, is past) is taken over only if the store says
nobody wrote it for a TTL. So a reader whose clock runs ahead, or a holder whose clock runs
behind, never takes a live lease: skew costs at most a later takeover of a dead holder's lease.

A lease object that does not parse (garbage bytes) names no holder: it is treated as held until
the object is older than the TTL (by the store's clock, from a HEAD), then taken over like an
expired lease. It never stops the worker that meets it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.core.errors import CorruptRecord
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.clocks import StoreClock
from orchestrator.core.protocol.crashes import alive_mark_due, inherit
from orchestrator.core.records import Lease, cas_update, read_record
from orchestrator.core.store import NotFound, PreconditionFailed, Store, ignore_stray

Clock = Callable[[], float]


class LeaseLost(Exception):
    """Our lease was taken over (it expired, or a faster worker took the chunk): stop the chunk."""

    def __init__(self, chunk: str, by: str | None = None, why: str | None = None):
        super().__init__(f"lease on {chunk} lost{f' to {by}' if by else ''}{f': {why}' if why else ''}")
        self.chunk = chunk
        self.by = by


@dataclass(frozen=True)
class HeldLease:
    lease: Lease
    etag: str

    @property
    def chunk(self) -> str:
        return self.lease.chunk


def read_lease(store: Store, layout: RunLayout, chunk: str) -> tuple[Lease, str] | None:
    return read_record(store, layout.lease(chunk), Lease)


def acquire(
    store: Store,
    layout: RunLayout,
    chunk: str,
    *,
    worker: str,
    holder: str,
    ttl: float,
    now: float,
    may_take: Callable[[Lease], bool] | None = None,
    store_clock: StoreClock | None = None,
) -> HeldLease | None:
    """Take the chunk's lease, or return None when someone else holds it.

    1. No lease yet: create it (put-if-absent; tried first, since most claims are of chunks
       nobody has touched).
    2. A lease exists: take it over by compare-and-swap when it is released or given up, expired
       (by our clock, and by the store's: not written for a TTL; `store_clock` knows our offset
       from it), held by an earlier process of the same worker (that process is gone: a worker id
       runs in one place at a time), or when `may_take` says so (a faster worker taking over from
       a slow one at the end of a run). A lease that is ours already is kept as it is. Taking over
       the lease of a holder that died (expired, given up, or our own earlier process) counts a
       crash of the chunk (crashes.inherit).
    3. Someone else changed it first: their lease is read again and judged by the same rules.
    """
    mine = Lease(chunk=chunk, worker=worker, holder=holder, acquired_at=now, renewed_at=now, expires_at=now + ttl)

    def take(current: Lease | None) -> Lease | None:
        if current is None:
            return mine
        if current.holder == holder:
            return None
        if current.released:
            return inherit(current, mine, died=False)
        if current.gave_up or current.worker == worker:
            return inherit(current, mine, died=True)
        if current.expires_at <= now:
            alive = store_clock is not None and _renewed_lately(store, layout.lease(chunk), current, ttl, store_clock)
            return None if alive else inherit(current, mine, died=True)
        if may_take is not None and may_take(current):
            return inherit(current, mine, died=False)
        return None

    try:
        lease, etag = cas_update(store, layout.lease(chunk), Lease, take, expect_new=True)
    except CorruptRecord as e:
        store_now = store_clock.now() if store_clock is not None else now
        return _take_corrupt(store, layout.lease(chunk), mine, str(e), ttl=ttl, now=store_now)
    if lease is None or etag is None or lease.holder != holder:
        return None
    return HeldLease(lease, etag)


def _renewed_lately(store: Store, key: str, lease: Lease, ttl: float, store_clock: StoreClock) -> bool:
    """The lease looks expired by our clock: did the store see it written within a TTL? Then its
    holder is alive, on a clock that differs from ours (the peer's offset is reported). Without a
    `store_clock` (the simulator, whose store and workers share one clock) ours decides alone."""
    info = store.head(key)
    if info is None:
        return False
    store_clock.peer(lease.worker, lease.holder, lease.renewed_at, info.modified)
    return store_clock.now() - info.modified <= ttl


def _take_corrupt(store: Store, key: str, mine: Lease, problem: str, *, ttl: float, now: float) -> HeldLease | None:
    """A lease object of garbage: ours by compare-and-swap once it is older than the TTL (`now`: the store's clock)."""
    info = store.head(key)
    if info is not None and now - info.modified <= ttl:
        ignore_stray(key, f"{problem}; treated as held until it is {ttl:g}s old")
        return None
    try:
        etag = store.get(key).etag
        return HeldLease(mine, store.compare_and_swap(key, mine.to_bytes(), etag))
    except (PreconditionFailed, NotFound):
        return None  # someone rewrote it meanwhile: judged again at the next claim


def renew(
    store: Store,
    layout: RunLayout,
    held: HeldLease,
    *,
    ttl: float,
    now: float,
    changes: Mapping[str, object] | None = None,
) -> HeldLease:
    """Extend the lease (with `changes` to its other fields). Raises LeaseLost if it changed since we last wrote it."""
    fresh = held.lease.model_copy(update={**(changes or {}), "renewed_at": now, "expires_at": now + ttl})
    try:
        return HeldLease(fresh, store.compare_and_swap(layout.lease(held.chunk), fresh.to_bytes(), held.etag))
    except PreconditionFailed:
        try:
            current = read_lease(store, layout, held.chunk)
        except CorruptRecord:
            raise LeaseLost(held.chunk, by="an object that is not a lease") from None
        raise LeaseLost(held.chunk, by=current[0].holder if current else None) from None


def release(store: Store, layout: RunLayout, held: HeldLease, *, now: float, died: bool = False) -> None:
    """Give the chunk back (shutdown before finishing it): mark the lease released, if it is still ours.
    With `died` (the engine failed under us), it is given up instead: free at once, and the next
    holder counts a crash of the chunk, as if we had died holding it (crashes.py).

    A compare-and-swap, not a delete: R2 has no conditional delete, and an unconditional one could
    remove a lease another worker took over in the meantime.
    """
    freed = held.lease.model_copy(update={"released": not died, "gave_up": died, "renewed_at": now, "expires_at": now})
    with contextlib.suppress(PreconditionFailed):  # not ours any more: nothing to give back
        store.compare_and_swap(layout.lease(held.chunk), freed.to_bytes(), held.etag)


class LeaseKeeper:
    """Keeps one held lease fresh. Every renewal goes through here, so the background renewer and a
    checkpoint never race each other's ETags into a false `LeaseLost`."""

    def __init__(self, store: Store, layout: RunLayout, held: HeldLease, *, ttl: float, clock: Clock):
        self.store = store
        self.layout = layout
        self.ttl = ttl
        self.clock = clock
        self._held = held
        self._lost: LeaseLost | None = None
        self._lock = threading.Lock()

    @property
    def chunk(self) -> str:
        return self._held.chunk

    @property
    def held(self) -> HeldLease:
        return self._held

    @property
    def lost(self) -> LeaseLost | None:
        return self._lost

    def renew(self) -> None:
        """Renew now. Raises LeaseLost (and remembers it) if the lease is no longer ours."""
        self._renew(None)

    def note_in_flight(self, rows: list[int]) -> None:
        """A careful holder's note (core/protocol/crashes.py): these rows go to the engine now.
        Written with a renewal, before the rows are handed over. Raises LeaseLost."""
        self._renew({"in_flight": rows, "noted_at": self.clock()})

    def _renew(self, changes: Mapping[str, object] | None) -> None:
        with self._lock:
            if self._lost is not None:
                raise self._lost
            try:
                self._held = renew(self.store, self.layout, self._held, ttl=self.ttl, now=self.clock(), changes=changes)
            except LeaseLost as e:
                self._lost = e
                raise

    def renew_if_due(self) -> None:
        """Renew when a third of the TTL has passed since the last renewal, or to mark the rows in
        flight alive once they outlived a quick death (crashes.alive_mark_due)."""
        lease, now = self._held.lease, self.clock()
        if now - lease.renewed_at >= self.ttl / 3 or alive_mark_due(lease, now):
            self.renew()

    def expired(self) -> bool:
        """Our lease ran out without a renewal (the store did not answer): others may take the chunk."""
        return self._held.lease.expires_at <= self.clock()

    def lose(self, why: str) -> None:
        """Treat the lease as lost (it expired while the store was unreachable): the chunk is dropped,
        and claiming decides later who continues it, from its checkpoints."""
        with self._lock:
            if self._lost is None:
                self._lost = LeaseLost(self.chunk, why=why)

    def release(self, *, died: bool = False) -> None:
        """Give the chunk back (see `release`; `died`: the engine failed under us)."""
        with self._lock:
            if self._lost is None:
                release(self.store, self.layout, self._held, now=self.clock(), died=died)

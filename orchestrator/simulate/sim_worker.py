"""A simulated worker: its machine, its pass over a chunk, and the virtual clock and parts it uses."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.checkpoints import ChunkJob, RowStat
from orchestrator.core.protocol.claims import ChunkClaimer
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import HeldLease, LeaseKeeper
from orchestrator.core.records import ManifestEntry
from orchestrator.core.store import Blob, ObjectInfo
from orchestrator.core.store.memory import MemoryStore
from orchestrator.simulate.config import SimConfig


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class UnitCodec:
    """Parts of the simulator: row indices as ranges, so a resume reads them back like real parts."""

    ext = "sim"

    def encode(self, rows: Sequence[RowStat]) -> bytes:
        indices = sorted(r.index for r in rows)
        if indices and indices[-1] - indices[0] == len(indices) - 1 == len(set(indices)) - 1:
            return f"[[{indices[0]}, {indices[-1]}]]".encode()  # one run of units (most parts): as json.dumps writes it
        ranges: list[list[int]] = []
        for index in indices:
            if ranges and index == ranges[-1][1] + 1:
                ranges[-1][1] = index
            else:
                ranges.append([index, index])
        return json.dumps(ranges).encode()

    def decode(self, data: bytes) -> list[RowStat]:
        return unit_rows([i for a, b in json.loads(data) for i in range(a, b + 1)])


#: One RowStat per unit index, shared: a unit never fails and counts no tokens (RowStat is frozen).
_UNIT_ROWS: list[RowStat] = []


def unit_rows(indices: Sequence[int]) -> list[RowStat]:
    """The stats of these units, made once per index rather than at every flush and resume."""
    top = max(indices, default=-1)
    if top >= len(_UNIT_ROWS):
        _UNIT_ROWS.extend(RowStat(i, False, 0, 0) for i in range(len(_UNIT_ROWS), top + 1))
    return list(map(_UNIT_ROWS.__getitem__, indices))


class LeaseReadStore(MemoryStore):
    """The simulator's store: before anyone reads a lease, `before_lease_read` is told which (None:
    a listing of them all), so the holder's renewals due by then are written first (fleet.py)."""

    def __init__(self, clock: SimClock, name: str, leases_prefix: str, before_lease_read: Callable[[str | None], None]):
        super().__init__(clock=clock, name=name)
        self._leases_prefix = leases_prefix
        self._before_lease_read = before_lease_read

    def get(self, key: str) -> Blob:
        if key.startswith(self._leases_prefix):
            self._before_lease_read(key)
        return super().get(key)

    def head(self, key: str) -> ObjectInfo | None:
        if key.startswith(self._leases_prefix):
            self._before_lease_read(key)
        return super().head(key)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        if prefix.startswith(self._leases_prefix) or self._leases_prefix.startswith(prefix):
            self._before_lease_read(None)
        return super().list(prefix, start_after)

    def etag_now(self, key: str) -> str | None:
        """The object's ETag, looked up as the simulator's own bookkeeping: no request, no hook."""
        obj = self._objects.get(key)
        return None if obj is None else obj[1]


class SimLeaseKeeper(LeaseKeeper):
    """A renewal at the very clock reading of the keeper's last one, with the lease still as that
    renewal wrote it, would write the same lease again: it is skipped. The simulator's clock
    stands still from a chunk's last flush to its marker, each of which renews (a real worker's
    clock has moved on by then, and a real lease may have changed).

    Within `deferred()` (a chunk's last flush and its marker, at one instant of the simulated
    clock), a renewal that would succeed (the lease is as this keeper last wrote it) is not
    written: the marker's tidy-up deletes the lease at that same instant, and nobody runs in
    between to read it. If the lease is still there at the end of the block (another worker's
    marker came first, so ours was not written), the renewal is written then, at its own time."""

    def __init__(self, store: LeaseReadStore, layout: RunLayout, held: HeldLease, *, ttl: float, clock: SimClock):
        super().__init__(store, layout, held, ttl=ttl, clock=clock)
        self.clock: SimClock = clock
        self._store = store
        self._deferring = False
        self._deferred_at: float | None = None

    def unchanged(self) -> bool:
        """Not lost, and the lease in the store is the one this keeper last wrote (a renewal would succeed)."""
        return self.lost is None and self._store.etag_now(self.layout.lease(self.held.chunk)) == self.held.etag

    def renew(self) -> None:
        now = self.clock()
        if (self.held.lease.renewed_at == now or self._deferring) and self.unchanged():
            if self._deferring:
                self._deferred_at = now
            return
        super().renew()

    def deferred(self) -> SimLeaseKeeper:
        """`with keeper.deferred():` (a plain context manager: one per chunk)."""
        self._deferring, self._deferred_at = True, None
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._deferring = False
        if kind is None and self._deferred_at is not None and self.unchanged():
            self.clock.now, saved = self._deferred_at, self.clock.now
            try:
                super().renew()
            finally:
                self.clock.now = saved


@dataclass
class Session:
    """One worker's pass over one chunk."""

    job: ChunkJob[Any]
    keeper: SimLeaseKeeper
    start: float
    remaining: list[int]
    #: Units of `remaining` checkpointed: in the store, or flushed in the end game and not yet
    #: observable (`written` of them are in the store; the rest is written when the lease is read).
    flushed: int = 0
    written: int = 0
    #: When the last of the flushed units were checkpointed (the time their part is stamped with).
    flushed_at: float = 0.0
    #: How much faster than the worker's rate this chunk goes: prefill saved by prefix-cache hits.
    speedup: float = 1.0
    #: When the lease's next renewal is due (every lease_ttl / 3 from the claim).
    next_renewal_at: float = 0.0


@dataclass
class SimWorker:
    index: int
    gpu: str
    rate: float  # units per second
    spot: bool
    price: float  # USD per hour
    up: bool = False
    exited_at: float | None = None
    epoch: int = 0
    restarts: int = 0
    billed_since: float | None = None
    billed_s: float = 0.0
    claimer: ChunkClaimer | None = None
    heartbeat: HeartbeatPublisher | None = None
    session: Session | None = None
    chunks_done: int = 0
    #: Launched by the deadline policy on top of the planned fleet (on-demand).
    extra: bool = False
    retired: bool = False
    #: When its machine is provisioned (capacity found): from then on it is coming up.
    provisioning_since: float | None = 0.0
    #: Prompt prefixes in its KV cache, least recently used first (emptied by a preemption).
    cached: list[str] = field(default_factory=list)


def prefix_speedup(config: SimConfig, prefix_aware: bool, entry: ManifestEntry, cached: list[str]) -> float:
    """rows / work left once prefix-cache hits are taken off (each hit saves `prefix_fraction` of a row).

    Prefix-aware (chunks in prefix order, rows fed by prefix): every row of a prefix after its
    first hits, and the first too when the worker's cache still holds the prefix (an edge prefix
    it served in its last chunks; `cached` is updated, least recent first). Otherwise rows come
    in input order over `prefixes` prefixes, and a row hits when its prefix is among the
    `cache_prefixes` held: about cache_prefixes / prefixes of them."""
    if not config.prefixes or entry.rows == 0:
        return 1.0
    if prefix_aware and entry.edge_prefixes:
        inner = max(0, (entry.prefix_groups or len(entry.edge_prefixes)) - len(entry.edge_prefixes))
        misses = inner + sum(p not in cached for p in entry.edge_prefixes)
        for p in entry.edge_prefixes:
            if p in cached:
                cached.remove(p)
            cached.append(p)
        del cached[: max(0, len(cached) - config.cache_prefixes)]
        hits: float = max(0, entry.rows - misses)
    else:
        hits = entry.rows * min(1.0, config.cache_prefixes / config.prefixes)
    return entry.rows / (entry.rows - config.prefix_fraction * hits)

"""Which chunk a worker takes next: its own list, then free chunks of others, then rescue of slow ones.

Static plan, dynamic finish. Each worker starts on its planned list (what users and the SkyPilot
example expect). When the list runs out it steals:
1. chunks nobody has leased, from the worker with the most untouched work, last chunk first
   (that worker would reach its tail last);
2. chunks whose lease looks expired (not rewritten for a TTL: its holder died);
3. at the end of a run, the chunk of a live worker so much slower that finishing the chunk here,
   from its last checkpoint, beats waiting for it (an A100 rescuing an L4's last chunk).
   The slow worker loses the lease at its next renewal and stops: it has nothing left to do.

Workers are never told what to do: every step is a lease taken by create-if-absent or
compare-and-swap, so any number of workers (replacements, late joiners) can run this at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from orchestrator.protocol.heartbeats import read_heartbeats
from orchestrator.protocol.layout import RunLayout
from orchestrator.protocol.leases import Clock, HeldLease, acquire
from orchestrator.protocol.records import Lease, PlanRecord
from orchestrator.store import Store


@dataclass(frozen=True)
class RunSnapshot:
    """What two listings say about a run: finished chunks, and when each lease was last written."""

    done: frozenset[str]
    lease_written: Mapping[str, float]


def take_snapshot(store: Store, layout: RunLayout) -> RunSnapshot:
    done = frozenset(layout.chunk_of(o.key, layout.done_prefix) for o in store.list(layout.done_prefix))
    leases = {layout.chunk_of(o.key, layout.leases_prefix): o.modified for o in store.list(layout.leases_prefix)}
    return RunSnapshot(done, leases)


@dataclass(frozen=True)
class RescuePolicy:
    """When a faster worker takes over a live, slower worker's chunk."""

    #: Take over only if we would finish in at most this fraction of the holder's remaining time.
    max_time_ratio: float = 0.5
    #: ...and the holder has at least this long left (seconds): not worth it for the last minutes.
    min_remaining_s: float = 300.0
    #: Our cost to take over: list and read the checkpoints, warm up the engine (seconds).
    takeover_overhead_s: float = 30.0
    #: A heartbeat older than this many seconds says nothing reliable about speed.
    max_heartbeat_age_s: float = 120.0


@dataclass(frozen=True)
class RescueCandidate:
    chunk: str
    holder: str
    worker: str
    their_remaining_s: float
    our_remaining_s: float


def steal_order(
    snapshot: RunSnapshot,
    plan: PlanRecord,
    work: Mapping[str, float],
    *,
    own: int | None,
    now: float,
    ttl: float,
    rng: random.Random,
) -> list[str]:
    """Chunks worth trying to take, best first (see the module docstring, steps 1 and 2).

    Victims with equal untouched work come in an order shuffled by `rng`, so that several idle
    workers do not all race for the same chunk.
    """
    untouched: list[tuple[float, list[str]]] = []
    for assignment in plan.workers:
        if assignment.worker == own:
            continue
        free = [c for c in assignment.chunks if c not in snapshot.done and c not in snapshot.lease_written]
        if free:
            untouched.append((sum(work.get(c, 1.0) for c in free), free))
    # Most untouched work first; equal loads in random order.
    rng.shuffle(untouched)
    untouched.sort(key=lambda item: -item[0])
    order: list[str] = []
    # Round-robin over victims, taking each one's tail first.
    queues = [list(reversed(free)) for _, free in untouched]
    while queues:
        for q in queues:
            order.append(q.pop(0))
        queues = [q for q in queues if q]
    planned = {c for a in plan.workers for c in a.chunks}
    order += sorted(c for c in work if c not in planned and c not in snapshot.done and c not in snapshot.lease_written)
    stale = sorted(
        (written, c) for c, written in snapshot.lease_written.items() if c not in snapshot.done and now - written > ttl
    )
    order += [c for _, c in stale]
    return order


def pick_rescue(
    heartbeats: Mapping[str, Mapping[str, Any]],
    *,
    our_worker: str,
    our_rows_per_s: float,
    now: float,
    policy: RescuePolicy,
) -> RescueCandidate | None:
    """The live chunk whose holder we would beat by the widest margin, if any (step 3)."""
    best: RescueCandidate | None = None
    for worker, hb in heartbeats.items():
        if worker == our_worker or hb.get("state") != "running" or not hb.get("chunk"):
            continue
        rate = float(hb.get("rows_per_s") or 0.0)
        left = max(int(hb.get("chunk_rows") or 0) - int(hb.get("chunk_rows_done") or 0), 0)
        if rate <= 0 or left == 0 or now - float(hb.get("updated_at") or 0) > policy.max_heartbeat_age_s:
            continue
        theirs = left / rate - (now - float(hb["updated_at"]))
        ours = left / our_rows_per_s + policy.takeover_overhead_s
        if theirs < policy.min_remaining_s or ours > policy.max_time_ratio * theirs:
            continue
        if best is None or theirs - ours > best.their_remaining_s - best.our_remaining_s:
            best = RescueCandidate(hb["chunk"], hb["holder"], worker, theirs, ours)
    return best


@dataclass
class ChunkClaimer:
    """Takes the next chunk for one worker process. The worker and the simulator both drive this."""

    store: Store
    layout: RunLayout
    worker: str
    holder: str
    plan: PlanRecord
    #: chunk -> estimated work (the planner's units); also the set of all chunks of the run.
    work: Mapping[str, float]
    ttl: float
    clock: Clock
    #: Our own list in the plan (None for a worker outside the plan: it only steals).
    own: int | None = None
    #: Our measured speed in rows per second (None until we have finished a chunk).
    rows_per_s: Callable[[], float | None] = lambda: None
    rescue: RescuePolicy | None = field(default_factory=RescuePolicy)
    rng: random.Random = field(default_factory=random.Random)
    #: Chunks of our own list already handed out, or found held by others: not tried again.
    _passed: set[str] = field(default_factory=set)

    def next_chunk(self) -> HeldLease | None:
        """A lease on the next chunk to work on, or None when nothing is left for us."""
        held = self._next_chunk()
        if held is not None:
            self._passed.add(held.chunk)
        return held

    def _next_chunk(self) -> HeldLease | None:
        snapshot = take_snapshot(self.store, self.layout)
        for chunk in self._own_chunks():
            if chunk in snapshot.done or chunk in self._passed:
                continue
            held = self._acquire(chunk)
            if held is not None:
                return held
            self._passed.add(chunk)
        now = self.clock()
        for chunk in steal_order(snapshot, self.plan, self.work, own=self.own, now=now, ttl=self.ttl, rng=self.rng):
            held = self._acquire(chunk)
            if held is not None:
                return held
        return self._rescue(now)

    def _own_chunks(self) -> Sequence[str]:
        if self.own is None:
            return ()
        for assignment in self.plan.workers:
            if assignment.worker == self.own:
                return assignment.chunks
        return ()

    def _acquire(self, chunk: str, may_take: Callable[[Lease], bool] | None = None) -> HeldLease | None:
        return acquire(
            self.store, self.layout, chunk,
            worker=self.worker, holder=self.holder, ttl=self.ttl, now=self.clock(), may_take=may_take,
        )  # fmt: skip

    def _rescue(self, now: float) -> HeldLease | None:
        speed = self.rows_per_s()
        if self.rescue is None or not speed:
            return None
        candidate = pick_rescue(
            read_heartbeats(self.store, self.layout),
            our_worker=self.worker, our_rows_per_s=speed, now=now, policy=self.rescue,
        )  # fmt: skip
        if candidate is None:
            return None
        return self._acquire(candidate.chunk, may_take=lambda lease: lease.holder == candidate.holder)

"""Which chunk a worker takes next: its own list, then untouched chunks of others, expired leases, rescues.

Static plan, dynamic finish. Each worker starts on its planned list (what users and the SkyPilot
example expect). When the list runs out it steals:
1. untouched chunks (nobody leased them yet): first those sharing a prompt prefix with a chunk
   this worker took (chunks prepared with `--group-by-prefix`: its engine has the prefix cached),
   then those of the worker with the most unfinished work, last chunk first: the owner works
   front to back and would reach its tail last;
2. chunks whose lease looks expired (not rewritten for a TTL: the holder died), and chunks the
   view took for done whose marker is gone (`orch redo`: markers, not stats, say what is done);
3. at the end of a run, the chunk of a live worker so much slower that finishing it here, from its
   last checkpoint, beats waiting (an A100 rescuing an L4's last chunk). The slow worker loses the
   lease at its next renewal and stops; it has nothing left to do and its machine is released.

Nobody assigns work: every step is a lease taken by create-if-absent or compare-and-swap, so any
number of workers (replacements, late joiners) can run this at once.

The cost of a claim does not grow with the run: what a worker knows (finished chunks, untouched
tails) lives in a `RunView` refreshed from the chunks finished since it last looked (stats keys
are in time order), and candidates are tried with create-if-absent instead of listing every lease.
Processes that share a view (replicas on one machine, the simulator's workers) share one memory.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.clocks import StoreClock
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.leases import Clock, HeldLease, acquire
from orchestrator.core.records import HeartbeatSummary, Lease, ManifestEntry, PlanRecord
from orchestrator.core.store import Store, StoreError, ignore_stray

_KEY = attrgetter("key")


@dataclass(frozen=True)
class PlanIndex:
    """The plan, indexed once; read-only, so any number of claimers can share it."""

    lists: Mapping[int, tuple[str, ...]]
    owner: Mapping[str, int]
    work: Mapping[str, float]
    #: Grouped by prefix: each chunk's edge prefixes, and the chunks of each prefix (ManifestEntry.edge_prefixes).
    prefixes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    by_prefix: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls, plan: PlanRecord, work: Mapping[str, float], prefixes: Mapping[str, Sequence[str]] | None = None
    ) -> PlanIndex:
        lists = {a.worker: tuple(a.chunks) for a in plan.workers}
        owner = {chunk: worker for worker, chunks in lists.items() for chunk in chunks}
        # Chunks outside the plan (a plan older than the manifest) belong to no one: anyone steals them.
        orphans = tuple(sorted(c for c in work if c not in owner))
        if orphans:
            lists[-1] = orphans
            owner.update({c: -1 for c in orphans})
        edges = {chunk: tuple(p) for chunk, p in (prefixes or {}).items() if p}
        by_prefix: dict[str, list[str]] = {}
        for chunk, names in sorted(edges.items()):
            for name in names:
                by_prefix.setdefault(name, []).append(chunk)
        return cls(lists, owner, dict(work), edges, {p: tuple(c) for p, c in by_prefix.items()})


def pool_of(plan: PlanRecord, own: int | None) -> str | None:
    """The model a worker of a run of several models loads: its planned list's (None: one model,
    or a worker outside the plan)."""
    return next((a.model for a in plan.workers if a.worker == own), None)


def pool_share(
    plan: PlanRecord, manifest: Sequence[ManifestEntry], model: str | None
) -> tuple[PlanRecord, list[ManifestEntry]]:
    """What a worker of `model`'s pool may claim: its pool's lists and chunks only, so that it
    takes and steals only chunks its engine can answer. None (a run of one model): everything."""
    if model is None:
        return plan, list(manifest)
    lists = [a for a in plan.workers if a.model == model]
    return plan.model_copy(update={"workers": lists}), [e for e in manifest if e.model == model]


class RunView:
    """What a worker knows about the run: finished chunks, and chunks known to be taken.

    `refresh()` lists the stats of chunks finished since the last refresh, minus a margin for
    clock skew between machines (stats keys carry the finisher's clock). Knowledge only grows:
    a finished chunk stays finished; a chunk seen taken is left to the lease-expiry step.
    """

    def __init__(
        self,
        store: Store,
        layout: RunLayout,
        index: PlanIndex,
        *,
        skew_margin_s: float = 600.0,
        recheck_every_s: float = 0.0,
        rng: random.Random | None = None,
    ):
        self.store = store
        self.layout = layout
        self.index = index
        self.skew_margin_s = skew_margin_s
        self.recheck_every_s = recheck_every_s
        self.rng = rng or random.Random()
        self.done: set[str] = set()
        #: The marker key of each chunk in `done` (key -> chunk): a recheck compares them with a
        #: listing of every marker as sets, not chunk by chunk.
        self._done_markers: dict[str, str] = {}
        self.taken: set[str] = set()
        self._last_finished: float | None = None
        self._rechecked_at: float | None = None
        self._listed: set[str] = set()
        self._reopened: list[str] = []
        # Untouched chunks of each list are those before its tail pointer that are neither done nor taken.
        self._tail = {worker: len(chunks) for worker, chunks in index.lists.items()}
        self._load = {worker: sum(index.work.get(c, 1.0) for c in chunks) for worker, chunks in index.lists.items()}
        self._heap = [(-load, self.rng.random(), worker) for worker, load in self._load.items()]
        heapq.heapify(self._heap)

    def refresh(self) -> None:
        start = (
            None if self._last_finished is None else self.layout.stats_since(self._last_finished - self.skew_margin_s)
        )
        # The margin makes every listing repeat the newest keys of the one before (a thousand
        # workers finishing in the same millisecond repeat a thousand): read only the new ones.
        # Those of a chunk a recheck reopened since are not taken for done again: the marker decides.
        listing = list(self.store.list(self.layout.stats_prefix, start_after=start))
        seen, self._listed = self._listed, {info.key for info in listing}
        for info in listing:
            if info.key in seen:
                continue
            # Only the chunk id is needed here: no decoding of the summary.
            try:
                finished, chunk, _ = self.layout.parse_stats(info.key)
            except ValueError:
                ignore_stray(info.key, "not a stats entry of this run")
                continue
            if self._last_finished is None or finished > self._last_finished:
                self._last_finished = finished
            self.mark_done(chunk)

    def recheck_done(self, now: float) -> list[str]:
        """Chunks this view held done that have no marker (one listing of done/), open again.

        Stats entries are a cache of the markers: a marker removed to redo its chunk (or one that
        never was: a stray stats entry) must not keep the chunk from running forever.

        The listing reads every marker of the run, so claimers sharing a view share it: it is made
        again once `recheck_every_s` has passed since the last one (0, a process's own view: at
        every call). Chunks it reopened are offered to every claimer of the view until one tries them.
        """
        if self._rechecked_at is None or now - self._rechecked_at >= self.recheck_every_s:
            self._rechecked_at = now
            gone = self._done_markers.keys() - set(map(_KEY, self.store.list(self.layout.done_prefix)))
            for chunk in sorted(c for c in map(self._done_markers.__getitem__, gone) if c in self.index.owner):
                del self._done_markers[self.layout.done(chunk)]
                self.done.discard(chunk)
                self.taken.discard(chunk)
                self._reopened.append(chunk)
        self._reopened = [c for c in self._reopened if self.is_open(c)]
        return list(self._reopened)

    def mark_done(self, chunk: str) -> None:
        if chunk not in self.done:
            self.done.add(chunk)
            self._done_markers[self.layout.done(chunk)] = chunk
            self._drop(chunk)

    def mark_taken(self, chunk: str) -> None:
        if chunk not in self.taken:
            self.taken.add(chunk)
            self._drop(chunk)

    def is_open(self, chunk: str) -> bool:
        return chunk not in self.done and chunk not in self.taken

    @property
    def exhausted(self) -> bool:
        """No untouched chunk left anywhere (as far as this view knows): the end of the run."""
        return not self._heap

    def untouched(self, exclude: int | None) -> Iterator[str]:
        """Untouched chunks, from the tail of the list with the most unfinished work first.

        Lists with equal loads come in random order, so idle workers spread over them.
        """
        skipped = []
        while self._heap:
            neg_load, tie, worker = heapq.heappop(self._heap)
            if -neg_load != self._load.get(worker):
                continue  # stale entry: a fresher one is in the heap
            if worker == exclude:
                skipped.append((neg_load, tie, worker))
                continue
            chunk = self._pop_tail(worker)
            if chunk is None:
                self._load.pop(worker, None)
                continue
            heapq.heappush(self._heap, (-self._load[worker], self.rng.random(), worker))
            yield chunk
        for entry in skipped:
            heapq.heappush(self._heap, entry)

    def put_back(self, chunk: str) -> None:
        """Undo the pop of an untouched chunk that could not be tried (the store did not answer)."""
        worker = self.index.owner.get(chunk)
        tail = self._tail.get(worker, 0) if worker is not None else -1
        if worker is not None and 0 <= tail < len(self.index.lists[worker]) and self.index.lists[worker][tail] == chunk:
            self._tail[worker] += 1

    def _pop_tail(self, worker: int) -> str | None:
        chunks = self.index.lists[worker]
        while self._tail[worker] > 0:
            self._tail[worker] -= 1
            chunk = chunks[self._tail[worker]]
            if self.is_open(chunk):
                return chunk
        return None

    def _drop(self, chunk: str) -> None:
        worker = self.index.owner.get(chunk)
        if worker in self._load:
            self._load[worker] -= self.index.work.get(chunk, 1.0)
            heapq.heappush(self._heap, (-self._load[worker], self.rng.random(), worker))


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


def pick_rescue(
    heartbeats: Mapping[str, HeartbeatSummary],
    *,
    our_worker: str,
    our_rows_per_s: float,
    now: float,
    policy: RescuePolicy,
) -> RescueCandidate | None:
    """The live chunk whose holder we would beat by the widest margin, if any (step 3).

    `now` is the store's time; each heartbeat's time is brought to the store's clock by the offset
    it carries (a peer whose clock runs behind must not look busy for longer than it is)."""
    best: RescueCandidate | None = None
    for worker, hb in heartbeats.items():
        if worker == our_worker or hb.state != "running" or not hb.chunk:
            continue
        rate = hb.rows_per_s
        left = max(hb.chunk_rows - hb.chunk_rows_done, 0)
        age = now - (hb.updated_at - (hb.clock_offset_s or 0.0))
        if rate <= 0 or left == 0 or age > policy.max_heartbeat_age_s:
            continue
        theirs = left / rate - age
        ours = left / our_rows_per_s + policy.takeover_overhead_s
        if theirs < policy.min_remaining_s or ours > policy.max_time_ratio * theirs:
            continue
        if best is None or theirs - ours > best.their_remaining_s - best.our_remaining_s:
            best = RescueCandidate(hb.chunk, hb.holder, worker, theirs, ours)
    return best


def expired_lease_chunks(store: Store, layout: RunLayout, view: RunView, *, now: float, ttl: float) -> list[str]:
    """Unfinished chunks whose lease was last written more than a TTL ago, oldest first (step 2).

    `now` is the store's time (StoreClock.now): the listing's times are the store's. They are a
    hint; `acquire` reads the lease itself before taking it over.
    """
    prefix = layout.leases_prefix
    # Live leases (most of them) are passed over in one comprehension: at the end of a run every
    # idle worker lists every lease at each claim. A stray key is judged once it is as old.
    old = [
        (info.modified, layout.chunk_of(info.key, prefix), info.key)
        for info in store.list(prefix)
        if now - info.modified > ttl
    ]
    owner, done = view.index.owner, view.done
    for key in [key for _, chunk, key in old if chunk not in owner]:
        ignore_stray(key, "not the lease of a chunk of this run")
    return [chunk for _, chunk, _ in sorted(lease for lease in old if lease[1] in owner and lease[1] not in done)]


@dataclass
class ChunkClaimer:
    """Takes the next chunk for one worker process. The worker and the simulator both drive this."""

    store: Store
    layout: RunLayout
    view: RunView
    worker: str
    holder: str
    ttl: float
    clock: Clock
    #: Our own list in the plan (None for a worker outside the plan: it only steals).
    own: int | None = None
    #: Our measured speed in rows per second (None until we have finished a chunk).
    rows_per_s: Callable[[], float | None] = lambda: None
    rescue: RescuePolicy | None = field(default_factory=RescuePolicy)
    #: False: only our own list, like the SkyPilot example's workers (the simulator compares both).
    steal: bool = True
    #: Called when no untouched chunk is left, before expired leases and rescues are looked at
    #: (the simulator flushes live workers' due checkpoints there).
    on_end_game: Callable[[], None] | None = None
    _own_next: int = 0
    #: Prompt prefixes of the chunks we took: our engine likely has them cached.
    served: set[str] = field(default_factory=set)
    #: Our offset from the store's clock (a worker's; None: `clock` is the store's, as in the simulator).
    store_clock: StoreClock | None = None

    def next_chunk(self, working_on: Collection[str] = ()) -> HeldLease | None:
        """A lease on the next chunk to work on, or None when nothing is left for us.

        `working_on`: chunks whose leases we hold already (a worker claims the next chunk while it
        finishes the current one). Never handed out again: a listing can make our own lease look
        expired (a late renewal, clock skew), and `acquire` gives a holder back its own lease.
        """
        self.view.refresh()
        held = self._from_own_list(working_on)
        if held is not None or not self.steal:
            return held
        held = self._from_untouched(working_on)
        if held is not None:
            return held
        if self.on_end_game is not None:
            self.on_end_game()
        for chunk in self.view.recheck_done(self.clock()):
            if chunk not in working_on and (held := self._take(chunk)) is not None:
                return held
        now = self.clock()
        store_now = self.store_clock.now() if self.store_clock is not None else now
        for chunk in expired_lease_chunks(self.store, self.layout, self.view, now=store_now, ttl=self.ttl):
            if chunk not in working_on and (held := self._take(chunk)) is not None:
                return held
        return self._rescue(store_now, working_on)

    def _from_own_list(self, working_on: Collection[str]) -> HeldLease | None:
        own_list = self.view.index.lists.get(self.own, ()) if self.own is not None else ()
        while self._own_next < len(own_list):
            chunk = own_list[self._own_next]
            # Tried even when seen taken: the holder may be an earlier process of this worker (a
            # restart after preemption), whose lease we take over at once. Anyone else keeps it.
            held = self._take(chunk) if chunk not in self.view.done and chunk not in working_on else None
            self._own_next += 1  # only once tried: a store that did not answer leaves it next in line
            if held is not None:
                return held
        return None

    def _from_untouched(self, working_on: Collection[str]) -> HeldLease | None:
        held = self._affine(working_on)
        if held is not None:
            return held
        for chunk in self.view.untouched(exclude=self.own):
            if chunk in working_on:
                continue
            try:
                held = self._take(chunk)
            except StoreError:
                self.view.put_back(chunk)  # not tried: still untouched
                raise
            if held is not None:
                return held
        return None

    def _affine(self, working_on: Collection[str]) -> HeldLease | None:
        """An open chunk sharing a prefix with one we took, if any is left (nobody holds it)."""
        index = self.view.index
        for name in sorted(self.served):
            for chunk in index.by_prefix.get(name, ()):
                if chunk not in working_on and self.view.is_open(chunk) and (held := self._take(chunk)) is not None:
                    return held
        return None

    def _take(self, chunk: str, may_take: Callable[[Lease], bool] | None = None) -> HeldLease | None:
        """The chunk's lease, if we get it and the chunk is still to do.

        A lease can be had on a finished chunk: its finisher wrote the marker and then deleted
        the lease, or died between the two. The marker decides: a finished chunk's lease is
        dropped and the chunk is not handed out."""
        held = acquire(
            self.store,
            self.layout,
            chunk,
            worker=self.worker,
            holder=self.holder,
            ttl=self.ttl,
            now=self.clock(),
            may_take=may_take,
            store_clock=self.store_clock,
        )
        self.view.mark_taken(chunk)
        if held is not None and self.store.head(self.layout.done(chunk)) is not None:
            self.view.mark_done(chunk)
            self.store.delete(self.layout.lease(chunk))
            return None
        if held is not None:
            self.served.update(self.view.index.prefixes.get(chunk, ()))
        return held

    def _rescue(self, now: float, working_on: Collection[str]) -> HeldLease | None:
        """A live, slower worker's chunk (step 3); `now` is the store's time."""
        speed = self.rows_per_s()
        if self.rescue is None or not speed:
            return None
        candidate = pick_rescue(
            read_heartbeats(self.store, self.layout),
            our_worker=self.worker,
            our_rows_per_s=speed,
            now=now,
            policy=self.rescue,
        )
        if candidate is None or candidate.chunk in working_on:
            return None
        return self._take(candidate.chunk, may_take=lambda lease: lease.holder == candidate.holder)

"""Worker heartbeats: a body for whoever wants details, and a summary in the key so one listing shows the fleet."""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Any

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.clocks import MEASURE_EVERY_S, StoreClock
from orchestrator.core.records import Heartbeat, HeartbeatSummary
from orchestrator.core.store import Store, StoreError, ignore_stray

#: A heartbeat older than this many heartbeat intervals describes a process that is gone: the
#: one rule status, reconcile, cancel, redo and the spec's unlocking all judge liveness by.
STALE_AFTER_BEATS = 6


def is_beating(beat: HeartbeatSummary | Heartbeat, *, now: float, heartbeat_interval: float) -> bool:
    """The process that wrote `beat` still runs: it has not exited and beat within STALE_AFTER_BEATS intervals."""
    return beat.state != "exited" and now - beat.updated_at <= STALE_AFTER_BEATS * heartbeat_interval


class HeartbeatPublisher:
    """Rewrites one worker's heartbeat: the new key first, then the previous one is deleted.

    A crash between the two leaves two keys for a worker; readers keep the newest. With a
    `store_clock`, the key just written measures our clock against the store's (clocks.py) every
    MEASURE_EVERY_S, and the next heartbeat carries the offset.
    """

    def __init__(self, store: Store, layout: RunLayout, heartbeat: Heartbeat, store_clock: StoreClock | None = None):
        self.store = store
        self.layout = layout
        self.heartbeat = heartbeat
        self.store_clock = store_clock
        self._measured_at: float | None = None
        self._key: str | None = None
        # Keys left by an earlier process of this worker id describe a process that is gone; its
        # uptime is carried over, so the worker's billed time survives restarts.
        self._stale = [o.key for o in store.list(f"{layout.heartbeats_prefix}{heartbeat.worker}/")]
        before, loaded = 0.0, heartbeat.loaded
        for key in self._stale:
            try:
                old = HeartbeatSummary.from_key(key.rsplit("/", 1)[1])
            except ValueError:
                continue
            if old.holder != heartbeat.holder:
                before = max(before, old.uptime_before_s + max(old.updated_at - old.started_at, 0.0))
                loaded = loaded or old.loaded
        self.heartbeat = heartbeat.model_copy(
            update={"uptime_before_s": heartbeat.uptime_before_s + before, "loaded": loaded}
        )

    def publish(self, **updates: Any) -> Heartbeat:
        clock = self.store_clock
        if clock is not None and clock.offset_s is not None:
            updates = {"clock_offset_s": round(clock.offset_s, 1), **updates}
        self.heartbeat = self.heartbeat.model_copy(update=updates)
        key = self.layout.heartbeat(self.heartbeat.worker, self.heartbeat.key_values())
        before = clock.clock() if clock is not None else 0.0
        self.store.put(key, self.heartbeat.to_bytes())
        if clock is not None and (self._measured_at is None or before - self._measured_at >= MEASURE_EVERY_S):
            after = clock.clock()
            info = self.store.head(key)
            if info is not None:
                clock.observe(before, after, info.modified)
                self._measured_at = before
        old, self._key = [*self._stale, self._key], key
        self._stale = []
        for stale in old:
            if stale and stale != key:
                with contextlib.suppress(StoreError):
                    self.store.delete(stale)
        return self.heartbeat


@lru_cache(maxsize=8192)
def _decode(encoded: str) -> HeartbeatSummary | None:
    """A heartbeat key's summary. Keys change only when a worker publishes, and every idle worker
    reads every heartbeat at the end of a run: most reads find keys decoded already (a summary is
    never changed once decoded, so one object can be shared)."""
    try:
        return HeartbeatSummary.from_key(encoded)
    except ValueError:
        return None


@lru_cache(maxsize=8192)
def _worker_and_summary(key: str, prefix: str) -> tuple[str, HeartbeatSummary | None]:
    """A key under the heartbeats prefix: its worker id and summary (cached by whole key, as `_decode`
    is by its summary part); every listing of all heartbeats reads its keys through this."""
    worker, _, encoded = key[len(prefix) :].partition("/")
    return worker, _decode(encoded)


def read_heartbeats(store: Store, layout: RunLayout) -> dict[str, HeartbeatSummary]:
    """worker id -> its newest heartbeat summary, from listings alone (one request per 1,000 workers)."""
    newest: dict[str, HeartbeatSummary] = {}
    prefix = layout.heartbeats_prefix
    for info in store.list(prefix):
        worker, summary = _worker_and_summary(info.key, prefix)
        if summary is None:
            ignore_stray(info.key, "not a heartbeat of this orch version")
            continue
        if worker not in newest or summary.updated_at > newest[worker].updated_at:
            newest[worker] = summary
    return newest


def older_twin(
    store: Store, layout: RunLayout, me: Heartbeat, *, beat_since: float | None = None
) -> HeartbeatSummary | None:
    """Another process of our worker id, started before us and still heartbeating, if any.

    Twins (a launch the jobs record lost, a machine thought dead that was not) both do the
    work of one id; the newer one exits. "Still heartbeating" means it published after we
    started: the last heartbeat of a process killed before we were launched is no twin. One
    listing of our own id's keys. `beat_since` asks a weaker question, "published since then":
    a process that may still be alive, which the worker waits on before loading its engine.
    """
    since = me.started_at + 1.0 if beat_since is None else beat_since
    prefix = f"{layout.heartbeats_prefix}{me.worker}/"
    for info in store.list(prefix):
        other = _decode(info.key[len(prefix) :])
        if other is None or other.holder == me.holder or other.state == "exited":
            continue
        alive_with_us = other.updated_at > since
        if alive_with_us and (other.started_at, other.holder) < (me.started_at, me.holder):
            return other
    return None


#: Listings `live_heartbeats` makes at most for a process whose listed beat is gone by its read:
#: each time it beat in between, so it lives; a starting worker beats several times in a second (its
#: first beat, its claim, its engine loaded), and `orch cancel` comes just then in tests and scripts.
LIVE_READ_ROUNDS = 10


def live_heartbeats(store: Store, layout: RunLayout, *, now: float, heartbeat_interval: float) -> list[Heartbeat]:
    """The full heartbeat (host and pid included) of every process still beating (`is_beating`):
    one listing, then one GET per such process. A publish writes its new key before it deletes the
    old one, so a listing may hold two keys of one process: its newest is the one read. A process
    whose listed key was gone by the GET (it beat in between) is listed and read again, up to
    LIVE_READ_ROUNDS listings in all. One that beat before every read (beats faster than a loaded
    reader lists and reads, or a store whose listings lag its deletes) was seen beating in every
    listing: it is alive, and comes back as its listed summary, host and pid unknown."""
    listed = _newest_beating(store, layout.heartbeats_prefix, now, heartbeat_interval)
    bodies: dict[str, Heartbeat] = {}
    for _ in range(LIVE_READ_ROUNDS):
        missed = set()
        for holder, (key, _worker, _summary) in listed.items():
            try:
                bodies[holder] = Heartbeat.from_bytes(store.get(key).data)
            except (StoreError, ValueError):
                # It published a newer beat and deleted the one listed in between (a beat a second
                # under load): listed again, not dropped as if it had stopped.
                missed.add(holder)
        if not missed:
            break
        again = _newest_beating(store, layout.heartbeats_prefix, now, heartbeat_interval)
        listed = {holder: seen for holder, seen in again.items() if holder in missed}
    for holder, (_key, worker, summary) in listed.items():
        if holder not in bodies:
            bodies[holder] = Heartbeat(worker=worker, **summary.model_dump())
    return list(bodies.values())


def _newest_beating(
    store: Store, prefix: str, now: float, heartbeat_interval: float
) -> dict[str, tuple[str, str, HeartbeatSummary]]:
    """holder -> (the key of its newest beat, its worker, that beat's summary), for every process still beating."""
    newest: dict[str, tuple[str, str, HeartbeatSummary]] = {}
    for info in store.list(prefix):
        worker, summary = _worker_and_summary(info.key, prefix)
        if summary is None or not is_beating(summary, now=now, heartbeat_interval=heartbeat_interval):
            continue
        seen = newest.get(summary.holder)
        if seen is None or summary.updated_at > seen[2].updated_at:
            newest[summary.holder] = (info.key, worker, summary)
    return newest


def newest_heartbeat_of(store: Store, layout: RunLayout, holder: str) -> Heartbeat | None:
    """The full last heartbeat of one process (by holder), exited or not: one listing, one GET."""
    prefix = layout.heartbeats_prefix
    for info in store.list(prefix):
        _worker, summary = _worker_and_summary(info.key, prefix)
        if summary is not None and summary.holder == holder:
            with contextlib.suppress(StoreError, ValueError):
                return Heartbeat.from_bytes(store.get(info.key).data)
    return None

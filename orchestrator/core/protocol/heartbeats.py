"""Worker heartbeats: a body for whoever wants details, and a summary in the key so one listing shows the fleet."""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Any

from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import Heartbeat, HeartbeatSummary
from orchestrator.core.store import Store, StoreError


class HeartbeatPublisher:
    """Rewrites one worker's heartbeat: the new key first, then the previous one is deleted.

    A crash between the two leaves two keys for a worker; readers keep the newest.
    """

    def __init__(self, store: Store, layout: RunLayout, heartbeat: Heartbeat):
        self.store = store
        self.layout = layout
        self.heartbeat = heartbeat
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
        self.heartbeat = self.heartbeat.model_copy(update=updates)
        key = self.layout.heartbeat(self.heartbeat.worker, self.heartbeat.summary().key_values())
        self.store.put(key, self.heartbeat.to_bytes())
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


def read_heartbeats(store: Store, layout: RunLayout) -> dict[str, HeartbeatSummary]:
    """worker id -> its newest heartbeat summary, from listings alone (one request per 1,000 workers)."""
    newest: dict[str, HeartbeatSummary] = {}
    prefix = layout.heartbeats_prefix
    for info in store.list(prefix):
        worker, _, encoded = info.key[len(prefix) :].partition("/")
        summary = _decode(encoded)
        if summary is None:
            continue  # not ours: a stray object under heartbeats/, or another version's
        if worker not in newest or summary.updated_at > newest[worker].updated_at:
            newest[worker] = summary
    return newest

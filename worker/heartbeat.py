"""The worker's background thread: it renews the leases, publishes the heartbeat, and watches for a cancel or a twin.

The engine loop never waits on a store request of this thread: it asks for a heartbeat with
`soon()` and goes on (a slow store costs heartbeats, not engine time). Every beat the thread
renews the leases that are due, publishes the newest figures, and stops the worker as SIGTERM
does when `orch cancel` was asked for or an older process of the same worker id is alive.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core.exits import WorkerStatus
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.clocks import StoreClock
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher, older_twin
from orchestrator.core.protocol.leases import LeaseKeeper, LeaseLost
from orchestrator.core.records import Heartbeat, HeartbeatSummary
from orchestrator.core.spec import WorkersSpec
from orchestrator.core.store import Store, StoreUnavailable
from worker.progress import ProgressReporter
from worker.totals import Totals


@dataclass
class WorkerIdentity:
    """Who this process is: its worker id, the plan list it works on first, and where it runs."""

    worker: str
    own: int | None
    holder: str
    accelerator: str | None = None
    spot: bool | None = None
    cloud: str | None = None
    region: str | None = None

    @staticmethod
    def new(worker: str, own: int | None, **kw: Any) -> WorkerIdentity:
        return WorkerIdentity(worker=worker, own=own, holder=f"{worker}.{uuid.uuid4().hex[:10]}", **kw)

    def first_heartbeat(self, started_at: float) -> Heartbeat:
        """The heartbeat of this process as it starts: who and where, no work yet."""
        return Heartbeat(
            worker=self.worker,
            holder=self.holder,
            state="starting",
            accelerator=self.accelerator,
            spot=self.spot,
            cloud=self.cloud,
            region=self.region,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=started_at,
            updated_at=started_at,
        )


class HeartbeatThread:
    """One worker's lease renewals and heartbeats, published from a thread of their own.

    `lock` is the worker's: it guards `totals` and `keepers` (the leases held, by chunk), which
    the engine loop changes; it is never held across a store request. Every beat carries the rows
    answered so far, flushed or only in memory (`in_hand`), and the live tokens/s: `status` shows
    progress between checkpoints within one interval."""

    def __init__(
        self,
        store: Store,
        layout: RunLayout,
        heartbeat: Heartbeat,
        *,
        settings: WorkersSpec,
        totals: Totals,
        keepers: dict[str, LeaseKeeper],
        in_hand: Callable[[], tuple[int, int]],
        lock: threading.Lock,
        clock: Callable[[], float],
        progress: ProgressReporter,
        store_down: Callable[[StoreUnavailable], None],
        store_ok: Callable[[], None],
        stopping: Callable[[], bool],
        request_stop: Callable[[str | None, WorkerStatus], None],
        store_clock: StoreClock | None = None,
    ):
        self.store = store
        self.layout = layout
        #: Each heartbeat written also measures our clock against the store's (protocol/clocks.py).
        self.publisher = HeartbeatPublisher(store, layout, heartbeat, store_clock)
        #: Seconds between two beats: a lease is renewed at least twice before it expires.
        self.interval = min(settings.heartbeat_interval, settings.lease_ttl / 3)
        self.totals = totals
        self.keepers = keepers
        #: (checkpointed, answered in memory) rows of the chunks in hand, read under `lock`.
        self.in_hand = in_hand
        self.lock = lock
        self.clock = clock
        self.progress = progress
        self._store_down = store_down
        self._store_ok = store_ok
        self._stopping = stopping
        self._request_stop = request_stop
        self._stop = threading.Event()
        #: Wakes the thread between two beats: a flush's progress, or the stop.
        self._beat_soon = threading.Event()
        #: One heartbeat PUT at a time, each with the newest figures.
        self._publishing = threading.Lock()
        #: What the engine loop has to say (a state, a chunk), for the thread to publish.
        self._pending: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="lease-and-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread; wait up to `timeout` seconds for it when one is given."""
        self._stop.set()
        self._beat_soon.set()
        if timeout is not None and self._thread is not None:
            self._thread.join(timeout=timeout)

    def soon(self, **updates: Any) -> None:
        """Publish the heartbeat now, from the thread: the engine loop never waits on the store
        for a heartbeat (its own store requests are the checkpoints that fence its rows)."""
        with self.lock:
            self._pending.update(updates)
        self._beat_soon.set()

    def publish(self, **updates: Any) -> None:
        """Publish the heartbeat from the calling thread; a store that does not answer only delays it."""
        try:
            self._publish_now(**updates)
        except StoreUnavailable as e:
            self._store_down(e)
        else:
            self._store_ok()

    def _publish_now(self, **updates: Any) -> None:
        with self._publishing:  # the figures read and their PUT, one publisher at a time
            with self.lock:
                t = self.totals
                saved, unsaved = self.in_hand()
                fields: dict[str, Any] = dict(
                    chunk=t.chunk,
                    chunk_rows=t.chunk_rows,
                    chunk_rows_done=t.chunk_rows_done,
                    chunks_done=t.chunks_done,
                    rows_done=t.requests,
                    errors=t.errors,
                    tokens_in=t.tokens_in,
                    tokens_out=t.tokens_out,
                    tokens_cached=t.tokens_cached,
                    busy_s=round(t.busy(), 3),
                    load_s=round(t.load_s, 3),
                    busy_cpu_s=round(t.busy_cpu(), 3),
                    first_batch=t.first_batch,
                    tokens_per_s=t.tokens_per_s(),
                    rows_per_s=t.rows_per_s() or 0.0,
                    rows_saved=saved,
                    rows_unsaved=unsaved,
                    updated_at=self.clock(),
                )
                fields.update(self._pending)
                self._pending = {}
            fields.update(updates)
            self.publisher.publish(**fields)

    def _beat(self) -> None:
        """Every beat: renew the leases due, publish the heartbeat, look for a cancel or a twin.
        Between beats, a flush's progress is published at once (status counts flushed rows)."""
        next_beat = time.monotonic() + self.interval
        while True:
            self._beat_soon.wait(max(0.0, next_beat - time.monotonic()))
            self._beat_soon.clear()
            if self._stop.is_set():
                return
            if time.monotonic() < next_beat:
                with contextlib.suppress(Exception):
                    self.publish()
                continue
            next_beat = time.monotonic() + self.interval
            self._renew_leases()
            with contextlib.suppress(Exception):
                self.publish()
            with contextlib.suppress(StoreUnavailable):
                self._watch_fleet()

    def _renew_leases(self) -> None:
        with self.lock:
            keepers = list(self.keepers.values())
        for keeper in keepers:
            try:
                keeper.renew_if_due()
            except LeaseLost:
                pass  # the loop drops the chunk at its next step
            except StoreUnavailable as e:
                self._store_down(e)
                if keeper.expired():
                    keeper.lose("it expired while the store was unreachable")

    def _watch_fleet(self) -> None:
        """`orch cancel`, and a twin: either stops this process as SIGTERM does (two reads a beat)."""
        if self._stopping():
            return
        if self.store.head(self.layout.cancel) is not None:
            self._request_stop(
                "orch cancel: stopping (finished rows are flushed, leases given back)", WorkerStatus.INTERRUPTED
            )
            return
        twin = older_twin(self.store, self.layout, self.publisher.heartbeat)
        if twin is not None:
            self.note_twin(twin)
            self._request_stop(None, WorkerStatus.DUPLICATE)

    def older_twin_before_start(self) -> HeartbeatSummary | None:
        """An older process of our id that is alive, found before we load an engine (a minute or
        more under load, during which the twin would claim and run rows for nothing).

        A fresh heartbeat alone does not prove it: a worker killed a moment ago and relaunched left
        one too. So while some older process of our id beat within two of its intervals, we wait
        for it to beat again after our start (the twin rule of older_twin); when its beats stop
        coming, it is dead and we go on. A twin whose beat was late past that is still caught by
        the check each beat (_watch_fleet) once we run."""
        me = self.publisher.heartbeat
        overdue_s = 2 * self.interval + 1.0
        while not self._stopping():
            try:
                twin = older_twin(self.store, self.layout, me)
                if twin is not None:
                    return twin
                if older_twin(self.store, self.layout, me, beat_since=self.clock() - overdue_s) is None:
                    return None
            except StoreUnavailable:
                return None  # the loop waits the outage out; the check each beat still applies
            time.sleep(min(0.5, self.interval / 2))
        return None

    def note_twin(self, twin: HeartbeatSummary) -> None:
        self.progress.note(
            f"worker {self.publisher.heartbeat.worker} also runs as {twin.holder} (started "
            f"{time.strftime('%H:%M:%S', time.localtime(twin.started_at))}): this newer process stops"
        )

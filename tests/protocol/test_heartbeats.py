"""Reading the processes that still beat while they beat: a beat published between the listing and
the read (its listed key deleted) must not make a live process look stopped."""

from __future__ import annotations

import time

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import LIVE_READ_ROUNDS, HeartbeatPublisher, live_heartbeats
from orchestrator.core.records import Heartbeat
from orchestrator.core.store import open_store


class BeatsWhileRead:
    """The store as a reader sees it while a worker beats: the first `times` reads of that worker's
    listed beat each come just after its next publish, which deleted it (a beat a second on a loaded
    machine; several in a second as a worker starts)."""

    def __init__(self, store, publisher: HeartbeatPublisher, times: int = 1):
        self.store, self.publisher, self.times, self.beaten = store, publisher, times, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get(self, key):
        if self.beaten < self.times and "/heartbeats/" in key:
            self.beaten += 1
            self.publisher.publish(updated_at=time.time(), chunk_rows_done=2 * self.beaten)
        return self.store.get(key)


def _beating(tmp_path, times: int) -> tuple[BeatsWhileRead, RunLayout]:
    """Worker 1 (pid 4242) has beaten once; the store then races its reads with `times` more beats."""
    store, layout = open_store(str(tmp_path)), RunLayout("r")
    now = time.time()
    beat = Heartbeat(worker="1", holder="1.a", state="running", started_at=now, updated_at=now, pid=4242)
    publisher = HeartbeatPublisher(store, layout, beat)
    publisher.publish()
    return BeatsWhileRead(store, publisher, times), layout


def test_a_worker_beating_between_the_listing_and_the_read_is_still_found(tmp_path):
    racing, layout = _beating(tmp_path, times=1)
    (found,) = live_heartbeats(racing, layout, now=time.time(), heartbeat_interval=1)
    assert racing.beaten == 1 and (found.holder, found.pid, found.chunk_rows_done) == ("1.a", 4242, 2)


def test_a_worker_beating_before_each_of_several_reads_as_it_starts_is_still_found(tmp_path):
    """`orch cancel` just after a worker's first beat (CI: the worker missed, so not stopped at once):
    its first beat, its claim and its loaded engine each publish, the reader's GET after each."""
    racing, layout = _beating(tmp_path, times=4)
    (found,) = live_heartbeats(racing, layout, now=time.time(), heartbeat_interval=1)
    assert racing.beaten == 4 and (found.holder, found.pid, found.chunk_rows_done) == ("1.a", 4242, 8)


def test_a_worker_beating_before_every_read_is_still_found_from_its_listed_beat(tmp_path):
    """A worker that beats faster than a loaded reader lists and reads (CI: a test's worker beating
    every 0.1 s on an S3 server at load 20 looked stopped, and `orch delete --force` deleted its
    run): seen beating in every listing, it is alive; its body was never read, so host and pid are
    unknown (a caller asking whether it runs on this machine must take it as alive elsewhere)."""
    racing, layout = _beating(tmp_path, times=3 * LIVE_READ_ROUNDS)
    (found,) = live_heartbeats(racing, layout, now=time.time(), heartbeat_interval=1)
    assert racing.beaten == LIVE_READ_ROUNDS
    assert (found.worker, found.holder, found.state, found.pid, found.host) == ("1", "1.a", "running", None, None)
    assert found.chunk_rows_done == 2 * LIVE_READ_ROUNDS  # the newest beat listed

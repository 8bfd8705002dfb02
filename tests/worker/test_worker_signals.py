"""The worker process under signals: SIGTERM's flush and SIGSTOP past the lease's TTL (vLLM in every
process; test_worker_kills.py holds the SIGKILLs: the two files' engine start-ups run side by side in
`make test-worker`)."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.errors import StoreBusy
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.leases import acquire, read_lease, release
from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.store import open_store
from orchestrator.core.store.base import StoreSettings
from tests.support.runs import make_run
from tests.support.worker_process import WorkerProcess, answered, chunk_of

pytestmark = pytest.mark.slow


def test_worker_sigterm_flushes_and_gives_the_lease_back(tiny_model, tmp_path):
    store_uri = str(tmp_path / "store")  # one store: the signal is the subject
    store = open_store(store_uri)
    layout = make_run(
        store,
        "term",
        [chunk_of("t", 2000, max_tokens=32)],
        model=tiny_model,
        workers=2,
        spec_flags={"workers.heartbeat_interval": 0.5},
    )
    worker = WorkerProcess(store_uri, "term", "0", tmp_path, "--checkpoint-interval", "3600")
    # Wait until the worker reports finished rows (its heartbeat), none flushed yet (the interval is an hour).
    deadline = time.monotonic() + 1000  # a hang guard: the worker loads its engine first
    while not (beat := read_heartbeats(store, layout).get("0")) or beat.rows_done == 0:
        assert time.monotonic() < deadline and worker.proc.poll() is None, worker.stderr
        time.sleep(0.1)
    assert not list(store.list(layout.outputs_prefix("part_00000")))
    worker.proc.send_signal(signal.SIGTERM)
    code, summary = worker.finish()
    assert code == 143 and summary["status"] == "INTERRUPTED"
    flushed = list(store.list(layout.outputs_prefix("part_00000")))
    assert len(flushed) == 1, "the finished rows were flushed on SIGTERM"
    codec = part_codec("jsonl", "part_00000")
    assert len(codec.decode(store.get(flushed[0].key).data)) >= beat.rows_done
    lease, _ = read_lease(store, layout, "part_00000")
    assert lease.released
    # Another worker takes the chunk at once (no TTL to wait out) and finishes only what is left.
    code, summary = WorkerProcess(store_uri, "term", "1", tmp_path).finish()
    assert code == 0 and 0 < summary["requests"] < 2000
    assert len(answered(store, layout)) == 2000


def test_worker_that_loses_a_lease_mid_chunk_drops_it_and_goes_on(tiny_model, tmp_path):
    """SIGSTOP past the lease's TTL mid-chunk, a peer takes the lease over, SIGCONT: the worker drops
    that chunk (no traceback), keeps its engine, finishes its other chunk and exits 0."""
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    ttl = 2.0
    layout = make_run(
        store,
        "lost",
        [chunk_of("l", 800, max_tokens=32), chunk_of("o", 20)],
        model=tiny_model,
        lists=[[0, 1], []],
        spec_flags={"workers.lease_ttl": ttl, "workers.heartbeat_interval": 0.5},
    )
    worker = WorkerProcess(store_uri, "lost", "0", tmp_path, "--checkpoint-interval", "1")
    deadline = time.monotonic() + 1000  # a hang guard: the worker loads its engine first
    while not (beat := read_heartbeats(store, layout).get("0")) or beat.chunk != "part_00000" or beat.rows_done == 0:
        assert time.monotonic() < deadline and worker.proc.poll() is None, worker.stderr
        time.sleep(0.05)
    # The peer waits a second, not 30, for a store write lock: the signal may freeze the worker
    # inside a write (its heartbeat thread renewing a lease), holding the lock (CI, load 30).
    peer_store = open_store(store_uri, StoreSettings(lock_timeout=1.0))
    worker.proc.send_signal(signal.SIGSTOP)
    try:
        # A peer takes the lease as soon as it has expired (the frozen worker cannot renew it).
        while True:
            try:
                peer = acquire(peer_store, layout, "part_00000", worker="1", holder="1.peer", ttl=600, now=time.time())
            except StoreBusy:  # frozen mid-write: let it finish that write, then freeze it again
                worker.proc.send_signal(signal.SIGCONT)
                time.sleep(0.1)
                worker.proc.send_signal(signal.SIGSTOP)
                continue
            if peer is not None:
                break
            time.sleep(0.1)
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    code, summary = worker.finish()
    assert "Traceback" not in worker.stderr, worker.stderr
    assert code == 0 and summary["status"] == "SUCCESS", worker.stderr
    assert summary["chunks_lost"] == 1 and summary["chunks_done"] == 1  # it went on with its other chunk
    assert "part_00000" in worker.stderr and "chunk dropped" in worker.stderr
    assert store.head(layout.done("part_00001")) is not None
    assert store.head(layout.done("part_00000")) is None  # the peer's now

    # The peer gives the chunk back; the next worker finishes it from the flushed parts.
    release(store, layout, peer, now=time.time())
    code, _ = WorkerProcess(store_uri, "lost", "1", tmp_path).finish()
    assert code == 0
    seen = answered(store, layout)
    assert len(seen) == 820 and set(seen.values()) == {1}

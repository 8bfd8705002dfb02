"""Real `python -m worker` processes under the protocol's hardest cases, on the scripted engine (the
subject is the store, the leases and the crash notes, not the model): a row alone in the engine through
two quick deaths, a worker frozen past its lease's TTL, three workers racing over the same chunks.
The same process on vLLM, killed and sent SIGTERM: tests/worker/test_worker_kills.py and
test_worker_signals.py."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.errors import StoreBusy
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.leases import acquire, read_lease, release
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import open_store
from orchestrator.core.store.base import StoreSettings
from tests.support.runs import make_run
from tests.support.worker_process import WorkerProcess, answered, chunk_of

pytestmark = pytest.mark.slow


@pytest.mark.scripted_engine(step_s=0.01)  # the victim alone in the engine for 9 s, each other row 1 s
def test_worker_a_row_alone_in_two_quick_deaths_is_answered_as_worker_crashed(tiny_model, tmp_path):
    """kill -9 the worker four times, the way a row that kills its process would: first anywhere
    in the chunk, then while the row is in a careful holder's noted group, then twice while it is
    alone in the engine (two pieces of evidence, from two processes). The fifth process answers
    that row with a `worker_crashed` error row naming the evidence and completes the chunk; no
    other row is lost or answered twice."""
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    rows, victim = 40, 35  # careful groups are rows 0-31, then 32-39: the victim's has 8 rows
    requests = chunk_of("p", rows, max_tokens=96)
    # The victim generates ten times longer than any other row (900 tokens of the model's 1,024),
    # so each state the test kills in lasts as long as the victim runs, on a fast machine as on a
    # loaded one: what the test waits for is the state, never a time.
    requests[victim]["body"]["max_tokens"] = 900
    layout = make_run(store, "poison", [requests], model=tiny_model)
    killed: list[str] = []

    def kill_when(ready, what: str) -> None:
        worker = WorkerProcess(store_uri, "poison", "0", tmp_path)
        hang_guard = time.monotonic() + 600  # a hang guard: the states come in seconds
        # The lease of the process killed before still shows its note: only this process's counts.
        while not (
            (lease := read_lease(store, layout, "part_00000")) and lease[0].holder not in killed and ready(lease[0])
        ):
            assert worker.proc.poll() is None, f"the worker ended before {what}: {worker.stderr}"
            assert time.monotonic() < hang_guard, f"never saw {what}: {lease}"
            time.sleep(0.01)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
        killed.append(lease[0].holder)

    kill_when(lambda found: found.crashes == 0, "the chunk taken")  # 1. unexplained: no note yet
    kill_when(lambda found: victim in (found.in_flight or ()), "the row in a noted group")
    kill_when(lambda found: found.in_flight == [victim], "the row alone in the engine")
    kill_when(lambda found: found.in_flight == [victim], "the row alone in the engine again")
    # The fourth holder knew of three deaths, one of them with the row alone: evidence, no verdict.
    lease, _ = read_lease(store, layout, "part_00000")
    assert lease.crashes == 3 and victim in lease.suspects and len(lease.suspects) > 1
    assert lease.lone_deaths == {victim: [killed[2]]} and not lease.poison

    code, summary = WorkerProcess(store_uri, "poison", "0", tmp_path).finish()
    assert code == 0 and summary["errors"] == 1
    marker = DoneMarker.model_validate_json(store.get(layout.done("part_00000")).data)
    lines = [line for part in marker.parts for line in iter_part_lines(store.get(part.key).data, "jsonl")]
    assert sorted(line.custom_id for line in lines) == sorted(f"p-{i}" for i in range(rows))
    crashed = [line for line in lines if line.failed]
    assert [(c.custom_id, c.error.code, c.response.status_code) for c in crashed] == [
        (f"p-{victim}", "worker_crashed", 500)
    ]
    assert f"row {victim} of chunk part_00000 was alone in the engine of 2 worker processes ({killed[2]}, " in (
        crashed[0].error.message
    )


@pytest.mark.scripted_engine(step_s=0.02)  # the first chunk lasts about 8 s: frozen mid-chunk
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
    deadline = time.monotonic() + 600  # a hang guard
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


@pytest.mark.scripted_engine(step_s=0.05)  # a chunk lasts about a second: the three workers overlap
def test_workers_racing_over_the_same_chunks_write_one_marker_each(tiny_model, tmp_path):
    store_uri = str(tmp_path / "store")  # one store: its create-if-absent races are tests/test_store_contract.py's
    store = open_store(store_uri)
    chunks = [chunk_of(f"r{c}", 20, max_tokens=16) for c in range(6)]
    # Everything is planned on worker 0; workers 1 and 2 have empty lists and steal.
    layout = make_run(store, "race", chunks, model=tiny_model, lists=[[0, 1, 2, 3, 4, 5], [], []])
    procs = [WorkerProcess(store_uri, "race", str(w), tmp_path) for w in range(3)]
    results = [p.finish() for p in procs]
    assert [code for code, _ in results] == [0, 0, 0]
    assert sum(s["chunks_done"] for _, s in results) == 6
    seen = answered(store, layout)
    assert len(seen) == 120 and set(seen.values()) == {1}
    holders = {DoneMarker.model_validate_json(store.get(o.key).data).holder for o in store.list(layout.done_prefix)}
    assert len(holders) >= 1

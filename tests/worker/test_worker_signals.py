"""The worker process on vLLM under SIGTERM: its flush and the lease given back (test_worker_kills.py holds
the SIGKILL: the two files' engine start-ups run side by side in `make test-worker`; a worker frozen past
its lease, on the scripted engine: tests/test_worker_processes.py)."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.leases import read_lease
from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.store import open_store
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

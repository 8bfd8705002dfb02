"""The worker process on vLLM killed: SIGKILL mid-chunk and a resume from the parts (test_worker_signals.py
holds SIGTERM: the two files' engine start-ups run side by side in `make test-worker`; the protocol's
harder deaths, on the scripted engine: tests/test_worker_processes.py)."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.store import open_store
from tests.support.runs import make_run
from tests.support.worker_process import WorkerProcess, answered, chunk_of, wait_for_parts

pytestmark = pytest.mark.slow


def test_worker_killed_mid_chunk_resumes_losing_at_most_one_interval(tiny_model, tmp_path):
    """kill -9 after a few checkpoints; a new process of the same worker resumes from the parts. On a
    local store: the kill is the subject (the stores' own semantics: tests/test_store_contract.py)."""
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    rows, interval = 2000, 1.0  # about 8 s of work for the tiny model on 2 cores
    layout = make_run(store, "kill", [chunk_of("k", rows, max_tokens=32)], model=tiny_model)
    first = WorkerProcess(store_uri, "kill", "0", tmp_path, "--checkpoint-interval", str(interval))
    wait_for_parts(store, layout, "part_00000", 2)
    first.proc.send_signal(signal.SIGKILL)
    killed_at = time.time()
    first.proc.wait()
    parts = list(store.list(layout.outputs_prefix("part_00000")))
    codec = part_codec("jsonl", "part_00000")
    flushed = sum(len(codec.decode(store.get(p.key).data)) for p in parts)
    assert 0 < flushed < rows, "the kill came too late to test a resume"
    # Work lost to the kill: whatever finished after the last flush, at most one interval of it.
    assert killed_at - max(p.modified for p in parts) <= interval + 1.0

    code, summary = WorkerProcess(store_uri, "kill", "0", tmp_path, "--checkpoint-interval", str(interval)).finish()
    assert code == 0
    assert summary["requests"] == rows - flushed  # flushed rows were not run again
    seen = answered(store, layout)
    assert len(seen) == rows and set(seen.values()) == {1}

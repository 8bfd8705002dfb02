"""The worker process on vLLM killed: SIGKILL mid-chunk three times, each new process resuming from the
parts (test_worker_signals.py holds SIGTERM: the two files' engine start-ups run side by side in `make
test-worker`; the protocol's harder deaths, on the scripted engine: tests/test_worker_processes.py)."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.protocol.parts import part_codec
from orchestrator.core.store import open_store
from tests.support.runs import make_run
from tests.support.worker_process import WorkerProcess, answered, chunk_of, wait_for_parts

pytestmark = pytest.mark.slow


def test_kill_storm_on_vllm_each_process_resumes_from_the_parts_and_every_row_is_answered_once(tiny_model, tmp_path):
    """The real-engine tier's kill storm: kill -9 the worker on vLLM three times mid-chunk, each time
    once its process has flushed two parts of its own; each new process of the same worker resumes
    from the parts flushed before (the chunk careful after the first death, its noted groups
    suspects after the next), losing at most one checkpoint interval to each kill; the fourth
    finishes the chunk: every row exactly once, no row blamed. On a local store: the kills are the
    subject (the stores' own semantics: tests/test_store_contract.py). The storm of two workers at
    random moments: tests/test_faults.py::test_kill_storm_blames_no_row, on the scripted engine."""
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    rows, interval = 2000, 1.0  # about 8 s of work for the tiny model on 2 cores, longer once careful
    layout = make_run(store, "kill", [chunk_of("k", rows, max_tokens=32)], model=tiny_model)
    codec = part_codec("jsonl", "part_00000")
    flushed = 0
    for kill in range(3):
        before = len(list(store.list(layout.outputs_prefix("part_00000"))))
        worker = WorkerProcess(store_uri, "kill", "0", tmp_path, "--checkpoint-interval", str(interval))
        wait_for_parts(store, layout, "part_00000", before + 2)
        worker.proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        worker.proc.wait()
        parts = list(store.list(layout.outputs_prefix("part_00000")))
        flushed = sum(len(codec.decode(store.get(p.key).data)) for p in parts)
        assert 0 < flushed < rows, f"kill {kill + 1} came too late to test a resume"
        # Work lost to the kill: whatever finished after the last flush, at most one interval of it.
        assert killed_at - max(p.modified for p in parts) <= interval + 1.0, f"kill {kill + 1}"

    code, summary = WorkerProcess(store_uri, "kill", "0", tmp_path, "--checkpoint-interval", str(interval)).finish()
    assert code == 0 and summary["errors"] == 0  # no row blamed for the deaths
    assert summary["requests"] == rows - flushed  # flushed rows were not run again
    seen = answered(store, layout)
    assert len(seen) == rows and set(seen.values()) == {1}

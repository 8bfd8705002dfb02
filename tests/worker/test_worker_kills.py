"""The worker process killed: SIGKILL mid-chunk and a resume from the parts, and a row alone in the
engine through two quick deaths (vLLM in every process; test_worker_signals.py holds SIGTERM and
SIGSTOP: the two files' engine start-ups run side by side in `make test-worker`)."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator.core.protocol.leases import read_lease
from orchestrator.core.protocol.parts import iter_part_lines, part_codec
from orchestrator.core.records import DoneMarker
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


@pytest.mark.timeout(3600)  # five engine loads: a hang guard, not a pace
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
        hang_guard = time.monotonic() + 1200  # loading the engine takes minutes on a loaded machine
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

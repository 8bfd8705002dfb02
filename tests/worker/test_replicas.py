"""Replicas on one machine: every replica's output relayed at once, and one exit code that hides no failure."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import pytest

from orchestrator.core.exits import WorkerExit
from worker.replicas import combined_exit_code, combined_summary, relay_outputs

# Replica 1 writes far more than a pipe holds (64 KiB) before it lets replica 0 finish: read one
# after the other, replica 0's pipe would be read to its end first while replica 1 blocks on its
# own full pipe, never releasing replica 0.
NOISY = """
import json, pathlib, sys
for i in range(4096):
    print("vllm log line %04d " % i + "x" * 100)
sys.stdout.flush()
pathlib.Path(sys.argv[1]).write_text("go")
print(json.dumps({"requests": 7, "chunks_done": 1, "wall_s": 2.0}))
"""
WAITS = """
import json, pathlib, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.01)
print("replica 0 done")
print(json.dumps({"requests": 5, "chunks_done": 2, "wall_s": 3.0}))
"""


def test_replicas_outputs_are_relayed_at_once_so_no_full_pipe_stalls_a_replica(tmp_path):
    go = str(tmp_path / "go")
    procs = [
        subprocess.Popen([sys.executable, "-c", WAITS, go], stdout=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, "-c", NOISY, go], stdout=subprocess.PIPE, text=True),
    ]
    out = io.StringIO()
    result: list = []
    relay = threading.Thread(target=lambda: result.append(relay_outputs(procs, out)), daemon=True)
    relay.start()
    relay.join(timeout=120)  # a hang guard only: the relay ends when both replicas have
    stalled = relay.is_alive()
    for p in procs:
        p.kill() if stalled else p.wait()
    assert not stalled, "a replica stalled on its full stdout pipe"
    assert [s["requests"] for s in result[0]] == [5, 7]  # each replica's summary, in order
    relayed = out.getvalue().splitlines()
    assert "replica 0 done" in relayed and sum(line.startswith("vllm log line") for line in relayed) == 4096
    assert not any(line.startswith("{") for line in relayed)  # summaries are held back, not printed
    total = combined_summary(result[0], [p.returncode for p in procs])
    assert total["requests"] == 12 and total["chunks_done"] == 3 and total["status"] == "SUCCESS"
    assert json.loads(json.dumps(total))["replicas"] == 2


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([0, 0], 0),
        ([1, 75], 1),  # a real failure is never relaunched for free
        ([75, 1], 1),
        ([0, 75], 75),
        ([75, WorkerExit.STOPPED], WorkerExit.STOPPED),
        ([0, WorkerExit.STOPPED, 2], 2),
    ],
)
def test_replicas_exit_code_puts_a_real_failure_first(codes, expected):
    assert combined_exit_code(codes) == expected
    status = combined_summary([], codes)["status"]
    assert status == {0: "SUCCESS", 75: "STORE_UNREACHABLE", WorkerExit.STOPPED: "INTERRUPTED"}.get(expected, "FAILED")

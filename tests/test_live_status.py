"""`orch status` during a local run shows what the workers already know: rows answered and not yet
saved within a heartbeat, checkpointed rows of unfinished chunks after the workers are gone, a killed
worker as failed at once, the final states, and a run time without the time it sat cancelled; and
every reading moves from the one before as the read model's table of moves allows."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.core.context import resolve_spec
from orchestrator.core.protocol.heartbeats import live_heartbeats
from orchestrator.core.records import read_jobs, read_marker
from orchestrator.runview.states import RunState, WorkerActivity, reachable
from tests.support.datasets import write_jsonl
from tests.support.events import wait_for
from tests.support.models import TINY
from tests.support.runs import chat_request

#: The workers' heartbeat interval in this test (seconds): what "within a beat" means.
INTERVAL = 2.0
pytestmark = [
    pytest.mark.slow,
    pytest.mark.orch_yaml(
        f"sampling:\n  temperature: 0\nworkers:\n  heartbeat_interval: {INTERVAL}\n"
        "  checkpoint_interval: 0.5\n  lease_ttl: 30\n"
    ),
]


#: Every status the test read, in order (the moves between them are checked at its end).
READINGS: list[dict[str, Any]] = []


def status(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", "--run", "live", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    READINGS.append(doc)
    return doc


def moves_not_in_the_table(readings: list[dict[str, Any]]) -> list[str]:
    """Each change of the run's state or a worker's activity between two readings in a row that no
    path of runview/states.MOVES allows."""
    wrong = []
    for before, after in itertools.pairwise(readings):
        pairs = [(RunState(before["state"]), RunState(after["state"]), "run")]
        activities = {w["worker"]: w["activity"] for w in before["workers"]}
        for w in after["workers"]:
            was = activities.get(w["worker"], WorkerActivity.NOT_LAUNCHED.value)
            pairs.append((WorkerActivity(was), WorkerActivity(w["activity"]), f"worker {w['worker']}"))
        wrong += [f"{who}: {a} -> {b}" for a, b, who in pairs if not reachable(a, b)]
    return wrong


def status_within_a_beat(capsys, since: float, shows: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first status that `shows` what is asked, read within one heartbeat interval of `since`."""
    while True:
        doc = status(capsys)
        if shows(doc) or time.monotonic() - since > INTERVAL:
            return doc
        time.sleep(0.05)


def log_line(workdir: Path, text: str) -> Callable[[], bool]:
    def seen() -> bool:
        return any(text in log.read_text() for log in (workdir / ".orch" / "logs" / "live").glob("worker-*.log"))

    return seen


@pytest.mark.scripted_engine(step_s=0.05)  # a 300-word row takes 15 s
def test_status_shows_live_rows_dead_workers_final_states_and_run_time_without_cancelled_time(workdir, capsys):
    # Two chunks; in each, one row answers in two tokens while five run 300: rows are answered
    # (and checkpointed, every half second) long before any chunk is done.
    READINGS.clear()
    rows = [
        chat_request(f"c{c}-{i}", f"Item {c} {i}", max_tokens=2 if i == 0 else 300, ignore_eos=True)
        for c in range(2)
        for i in range(6)
    ]
    data = write_jsonl(workdir / "rows.jsonl", rows)
    model = str(TINY)
    assert main(["prepare", str(data), "--run", "live", "--format", "openai-batch", "--num-chunks", "2"]) == 0
    assert main(["launch", "--run", "live", "--model", model, "--workers", "1"]) == 0

    # 1. The first answered row (the worker's log says so) shows in status within one heartbeat.
    wait_for("the worker's first answered row", log_line(workdir, "first row answered"))
    answered_at = time.monotonic()
    doc = status_within_a_beat(capsys, answered_at, lambda d: d["rows"]["done"] + d["rows"]["in_progress"] > 0)
    assert doc["rows"]["done"] + doc["rows"]["in_progress"] > 0, doc["rows"]
    assert doc["chunks"]["done"] == 0, doc["chunks"]

    # 2. Checkpointed rows of unfinished chunks count as done; a killed worker reads failed at once.
    doc = wait_for("a checkpoint", lambda: (d := status(capsys))["rows"]["checkpointed"] > 0 and d)
    saved = doc["rows"]["done"]
    ctx = resolve_spec(None, {"run": "live"})
    # One process; a publish writes its new key before it deletes the old one, so a listing may see both.
    (pid,) = {beat.pid for beat in live_heartbeats(ctx.store, ctx.layout, now=time.time(), heartbeat_interval=INTERVAL)}
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    doc = status_within_a_beat(capsys, killed_at, lambda d: d["workers"][0]["activity"] == "failed")
    (worker,) = doc["workers"]
    assert (worker["state"], worker["activity"]) == ("FAILED", "failed"), worker
    assert doc["chunks"]["done"] == 0 and doc["rows"]["done"] >= saved > 0, doc["rows"]
    assert doc["rows"]["in_progress"] == 0 and doc["throughput"]["tokens_per_s"] == 0, doc

    # 3. Cancelled: the checkpointed rows stay shown, and the run time stops.
    assert main(["cancel", "--run", "live"]) == 0
    before = status(capsys)
    assert before["state"] == "cancelled" and before["rows"]["done"] >= saved, before["rows"]
    wait_for("the clock to move on", lambda: time.monotonic() - killed_at > 2 * INTERVAL)
    after = status(capsys)
    assert after["run_time_s"] == before["run_time_s"], (before["run_time_s"], after["run_time_s"])

    # 4. Resumed to the end: no worker reads RUNNING under a complete run, the finished one reads
    #    SUCCEEDED, and the run time leaves out the time the run sat cancelled.
    assert main(["resume", "--run", "live"]) == 0
    complete = wait_for("the run to complete", lambda: (d := status(capsys))["complete"] and d)
    assert complete["workers"][0]["state"] != "RUNNING", complete["workers"]
    done = wait_for("the worker's exit", lambda: (d := status(capsys))["workers"][0]["state"] == "SUCCEEDED" and d)
    assert done["workers"][0]["activity"] == "finished" and done["state"] == "complete"
    jobs, _ = read_jobs(ctx.store, ctx.layout)
    ((cancelled, resumed),) = jobs.pauses
    launched = min(a.launched_at for w in jobs.workers.values() for a in w.attempts)
    markers = [read_marker(ctx.store, ctx.layout, c) for c in ("part_00000", "part_00001")]
    finished = max(m.finished_at for m in markers if m is not None)
    expected = finished - launched - (resumed - cancelled)
    assert resumed - cancelled > INTERVAL and done["run_time_s"] == pytest.approx(expected, abs=0.2)
    assert done["overall"]["wall_s"] == pytest.approx(expected, abs=0.2), done["overall"]

    # 5. Reading after reading, the run and its worker moved only as the table of moves allows.
    seen = [(d["state"], [w["activity"] for w in d["workers"]]) for d in READINGS]
    assert len(READINGS) > 10 and not moves_not_in_the_table(READINGS), (moves_not_in_the_table(READINGS), seen)

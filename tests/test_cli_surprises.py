"""Small surprises a user met: files only their owner could read, a redo that deleted without
asking, a cancel counted as a recovery, a cancelled run whose header did not say so."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.records import JobAttempt, update_jobs
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk, chat_request, make_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def answered(project: Path, run: str = "r"):
    store = open_store(str(project / ".orch"))
    # Each row its own id: collect refuses to write two lines with one id.
    layout = make_run(store, run, [[chat_request(f"r{c}-{i}", "q") for i in range(2)] for c in range(2)], model="m")
    for c in (0, 1):
        answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"r{c}-{i}", "x") for i in range(2)]])
    return store, layout


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o002, 0o664)])
def test_outputs_and_store_objects_are_made_with_the_users_umask(project, mask, mode):
    old = os.umask(mask)
    try:
        _, layout = answered(project)
        assert main(["collect", "--run", "r", "--out", "o.jsonl", "--retry-out", "retry.jsonl"]) == 0
    finally:
        os.umask(old)
    assert (project / "o.jsonl").stat().st_mode & 0o777 == mode
    assert (project / "retry.jsonl").stat().st_mode & 0o777 == mode
    marker = project / ".orch" / layout.done("part_00000")
    assert marker.stat().st_mode & 0o777 == mode


def test_redo_without_a_terminal_needs_yes_and_deletes_nothing_until_then(project, capsys):
    store, layout = answered(project)
    assert main(["redo", "--run", "r", "--chunk", "0"]) == 1
    err = capsys.readouterr().err
    assert "ERROR redo: not deleting the done marker, stats and output parts of 1 chunk(s) of run 'r'" in err
    assert "hint: add --yes" in err
    assert store.head(layout.done("part_00000")) is not None
    assert main(["redo", "--run", "r", "--chunk", "0", "--yes"]) == 0
    assert store.head(layout.done("part_00000")) is None


def test_redo_on_a_terminal_asks_and_a_no_keeps_the_outputs(project):
    store, layout = answered(project)
    leader, follower = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "redo", "--run", "r", "--chunk", "1"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=project,
        env=env,
    )
    os.close(follower)
    seen = b""
    while b"to run them again? [y/N]" not in seen:  # the question, then our answer
        chunk = os.read(leader, 1024)
        assert chunk, seen
        seen += chunk
    os.write(leader, b"n\n")
    assert proc.wait(timeout=120) == 1
    os.close(leader)
    assert b"part_00001" in seen
    assert store.head(layout.done("part_00001")) is not None


def test_a_cancelled_run_says_so_and_a_launch_after_a_cancel_is_no_recovery(project, capsys):
    store, layout = make_run_launched(project)
    assert main(["cancel", "--run", "c"]) == 0
    capsys.readouterr()
    assert main(["status", "--run", "c"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("CANCELLED")

    def relaunch(rec):  # what `orch launch` records after a cancel
        rec.cancelled = False
        rec.worker(0).attempts.append(JobAttempt(job_id="local-2-0-2", backend="local", launched_at=time.time()))

    update_jobs(store, layout, relaunch)
    assert main(["status", "--run", "c"]) == 0
    out = capsys.readouterr().out
    assert "recovered" not in out and "CANCELLED" not in out.splitlines()[0]

    def failed_and_relaunched(rec):  # a job that failed and was relaunched is a recovery
        rec.worker(0).attempts.append(
            JobAttempt(job_id="local-3-0-3", backend="local", launched_at=time.time(), reason="relaunch after FAILED")
        )

    update_jobs(store, layout, failed_and_relaunched)
    assert main(["status", "--run", "c"]) == 0
    assert "(recovered 1x)" in capsys.readouterr().out


def make_run_launched(project: Path):
    store = open_store(str(project / ".orch"))
    layout = make_run(store, "c", [[chat_request("a", "q")]], model="m")

    def launched(rec):
        rec.backend = "local"
        rec.worker(0).attempts.append(JobAttempt(job_id="local-1-0-1", backend="local", launched_at=time.time()))

    update_jobs(store, layout, launched)
    return store, layout


def test_run_again_after_ctrl_c_says_it_re_attached_to_the_running_workers(project, capsys):
    """`orch run` again while its workers run on (after a Ctrl-C) launches nothing and says it
    re-attached to them, not `launched 0 worker(s)`; it follows them to the end and collects.
    The running worker is a process the local backend judges live as it judges any (its pid and
    start time); the test finishes its chunk through the protocol's own objects."""
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.processes import start_ticks

    write_jsonl(project / "q.jsonl", [{"id": f"q{i}", "text": f"Question {i}?"} for i in range(3)])
    prepare = ["q.jsonl", "--run", "again", "--format", "text", "--id-column", "id", "--num-chunks", "1"]
    prepare += ["--model", "org/some-model"]
    run = ["run", *prepare, "--workers", "1", "--out", "out.jsonl", "--interval", "0.2"]
    assert main(["prepare", *prepare]) == 0
    store, layout = open_store(str(project / ".orch")), RunLayout("again")
    worker = subprocess.Popen(["sleep", "600"])  # the worker that ran on after the Ctrl-C
    again = None
    try:

        def running(rec):
            rec.backend = "local"
            job_id = f"local-{worker.pid}-{start_ticks(worker.pid)}-{int(time.time() * 1000)}"
            rec.worker(0).attempts.append(JobAttempt(job_id=job_id, backend="local", launched_at=time.time()))

        update_jobs(store, layout, running)
        capsys.readouterr()
        assert main(["resume", "--run", "again"]) == 0
        assert capsys.readouterr().out == "1 chunk(s) left; 1 worker(s) already running (0) on the local backend\n"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        again = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *run],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert again.stdout is not None
        said = [again.stdout.readline()]
        while "backend" not in said[-1] and said[-1]:  # until the line about the workers (or the end)
            said.append(again.stdout.readline())
        assert said[-1].strip() == "re-attached to 1 running worker(s) (0) on the local backend", said
        answer_chunk(store, layout, "part_00000", [[Answer(i, f"q{i}", "x") for i in range(3)]])
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert "wrote 3 of 3 rows" in out and "launched" not in "".join(said) + out
    finally:
        for proc in (again, worker):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_a_launch_its_controller_died_reserving_is_launched_again_at_once(project, capsys):
    """A controller SIGKILLed between reserving a worker's launch and recording its job left the
    reservation: on the same machine, the next command sees its controller gone and launches that
    worker again at once (it waited 15 minutes before); a reservation whose controller still runs
    is left to it. The controllers are real processes: one ended, one alive."""
    import json
    import socket

    from orchestrator.backends.local import stop_started_here
    from orchestrator.core.processes import start_ticks
    from orchestrator.core.records import read_jobs

    store = open_store(str(project / ".orch"))
    chunks = [[chat_request("a", "q")], [chat_request("b", "q")]]
    layout = make_run(store, "k", chunks, model="org/some-model", workers=2)
    dead, live = subprocess.Popen(["sleep", "0"]), subprocess.Popen(["sleep", "600"])
    names = {w: f"{socket.gethostname()}:{p.pid}:{start_ticks(p.pid)}" for w, p in ((0, dead), (1, live))}
    dead.wait()
    try:

        def reserved(rec):  # what launch_workers' reservation leaves when its controller is killed
            rec.backend = "local"
            for w, by in names.items():
                attempt = JobAttempt(
                    job_id=f"pending-{w}-w{w}", backend="local", launched_at=time.time(), pending=True, reserved_by=by
                )
                rec.worker(w).attempts.append(attempt)

        update_jobs(store, layout, reserved)
        capsys.readouterr()
        assert main(["status", "--run", "k", "--json"]) == 0
        workers = {int(w["worker"]): w for w in json.loads(capsys.readouterr().out)["workers"]}
        assert workers[0]["state"] == "FAILED", workers[0]
        assert f"the controller that reserved it (pid {dead.pid}) is gone" in workers[0]["failure_reason"]
        assert workers[1]["state"] == "PENDING", workers[1]

        assert main(["resume", "--run", "k"]) == 0
        out = capsys.readouterr().out
        assert out == "2 chunk(s) left; launched 1 worker(s) and 1 worker(s) already running (1) on the local backend\n"
        record, _ = read_jobs(store, layout)
        assert [len(record.worker(w).attempts) for w in (0, 1)] == [2, 1]
        assert record.worker(0).attempts[-1].job_id.startswith("local-")
    finally:
        stop_started_here()
        live.kill()
        live.wait()

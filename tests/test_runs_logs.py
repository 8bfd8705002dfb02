"""`orch runs` (a store's runs at a glance) and `orch logs` (a run's worker logs, followed to the run's end)."""

from __future__ import annotations

import json
import threading
import time

from orchestrator.cli import main
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.records import Heartbeat, JobAttempt, update_jobs
from orchestrator.core.store import open_store
from tests.support.runs import Answer, answer_chunk, chat_request, make_run


def three_runs(store_uri: str) -> None:
    """`done` complete, `going` half done with a worker working, `stopped` cancelled."""
    store = open_store(store_uri)
    for name in ("done", "going", "stopped"):
        layout = make_run(
            store, name, [[chat_request(f"{name}{c}-{i}", "q") for i in range(3)] for c in range(2)], model="m"
        )
        for c in (0, 1) if name == "done" else (0,):
            answer_chunk(store, layout, f"part_0000{c}", [[Answer(i, f"{name}{c}-{i}", "x") for i in range(3)]])
        if name == "going":
            now = time.time()
            beat = Heartbeat(worker="0", holder="0.a", state="running", started_at=now - 60, updated_at=now)
            HeartbeatPublisher(store, layout, beat).publish(chunk="part_00001", chunk_rows=3, chunk_rows_done=1)
        if name == "stopped":

            def cancel(rec):
                rec.worker(0).attempts.append(JobAttempt(job_id="1", backend="local", launched_at=time.time()))
                rec.cancelled = True

            update_jobs(store, layout, cancel)


def test_runs_lists_every_run_with_its_state_and_progress(store_uri, capsys):
    three_runs(store_uri)
    store = open_store(store_uri)
    store.requests.reset()
    from orchestrator.runview.runs import run_names

    assert run_names(store) == ["done", "going", "stopped"]
    assert store.requests.by_op.get("list", 0) == 4  # one per run, and the one that finds no more
    assert main(["runs", "--store", store_uri, "--json"]) == 0
    docs = {d["run"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {name: d["state"] for name, d in docs.items()} == {
        "done": "complete",
        "going": "running",
        "stopped": "cancelled",
    }
    assert docs["going"]["chunks"] == {"total": 2, "done": 1} and docs["done"]["rows"]["done"] == 6
    assert main(["runs", "--store", store_uri]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "state", "backend"]
    assert [line.split()[:2] for line in table[1:]] == [
        ["done", "complete"],
        ["going", "running"],
        ["stopped", "cancelled"],
    ]


def test_runs_shows_each_runs_model_and_input(tmp_path, capsys):
    store_uri = str(tmp_path / "store")
    (tmp_path / "tickets.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "many").mkdir()
    for name in ("x.jsonl", "y.jsonl"):
        (tmp_path / "many" / name).write_text('{"text": "b"}\n')
    prepare = ["prepare", "--store", store_uri, "--format", "text"]
    assert main([*prepare, str(tmp_path / "tickets.jsonl"), "--run", "one", "--model", "org/Model-8B"]) == 0
    assert main([*prepare, str(tmp_path / "many"), "--run", "two"]) == 0
    capsys.readouterr()
    assert main(["runs", "--store", store_uri, "--json"]) == 0
    docs = {d["run"]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert (docs["one"]["model"], docs["one"]["input"]) == ("org/Model-8B", str(tmp_path / "tickets.jsonl"))
    assert (docs["two"]["model"], docs["two"]["input"]) == (None, f"{tmp_path / 'many'}/ (2 files)")
    assert main(["runs", "--store", store_uri]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["run", "state", "backend", "model", "input"]
    assert table[1].split()[3] == "org/Model-8B"


def test_delete_removes_every_object_of_the_run_only_with_yes_and_not_under_live_workers(store_uri, capsys):
    three_runs(store_uri)
    store = open_store(store_uri)
    from orchestrator.runview.runs import run_names

    before = {info.key for info in store.list("runs/done/")}
    assert main(["delete", "--run", "done", "--store", store_uri]) == 1  # no --yes: says, deletes nothing
    out, err = capsys.readouterr()
    assert f"would delete {len(before)} object(s)" in out and "add --yes" in err
    assert {info.key for info in store.list("runs/done/")} == before
    assert main(["delete", "--run", "done", "--store", store_uri, "--yes"]) == 0
    assert f"deleted run 'done': {len(before)} object(s)" in capsys.readouterr().out
    assert run_names(store) == ["going", "stopped"] and not list(store.list("runs/done/"))
    # A worker of `going` beats: its run is kept unless --force says otherwise.
    assert main(["delete", "--run", "going", "--store", store_uri, "--yes"]) == 1
    err = capsys.readouterr().err
    assert "run 'going' is running" in err and "or add --force: it stops every worker" in err
    assert run_names(store) == ["going", "stopped"]
    assert main(["delete", "--run", "gone", "--store", store_uri, "--yes"]) == 5


def test_delete_force_refuses_while_a_worker_it_told_to_stop_still_beats(store_uri, capsys):
    """A worker on another machine that keeps beating after cancel.json (cut off from the store's
    cancel, say): --force waits the heartbeats' staleness out, then refuses with nothing deleted;
    once its beats stop, --force deletes."""
    store = open_store(store_uri)
    # Stale after six intervals: 12 s, so that a loaded machine's pause in the beats or the S3
    # server's answers (CI at load 20: 0.5 s, stale after 3 s, once deleted the run) is no stop.
    flags = {"workers.heartbeat_interval": 2.0}
    layout = make_run(store, "stubborn", [[chat_request("s0", "q")]], model="m", spec_flags=flags)
    stop = threading.Event()
    began = time.time()
    beat = Heartbeat(
        worker="0", holder="0.b", state="running", host="elsewhere", pid=4242, started_at=began, updated_at=began
    )
    publisher = HeartbeatPublisher(store, layout, beat)
    publisher.publish()  # beating before delete looks

    def beat_on() -> None:
        while not stop.wait(0.1):
            publisher.publish(updated_at=time.time())

    beating = threading.Thread(target=beat_on)
    beating.start()
    try:
        assert main(["delete", "--run", "stubborn", "--store", store_uri, "--yes", "--force"]) == 1
        err = capsys.readouterr().err
        assert "1 worker(s) still alive after they were told to stop (worker 0 (pid 4242 on elsewhere))" in err
        assert "nothing deleted" in err and store.head(layout.manifest) is not None
        # Cancelled now, and its worker beats on: a plain delete refuses too (it would delete a
        # run the worker still writes into).
        assert main(["delete", "--run", "stubborn", "--store", store_uri, "--yes"]) == 1
        err = capsys.readouterr().err
        assert "run 'stubborn' is cancelled with 1 worker(s) still going (0); nothing deleted" in err
        assert "add --force" in err and store.head(layout.manifest) is not None
    finally:
        stop.set()
        beating.join()
    assert main(["delete", "--run", "stubborn", "--store", store_uri, "--yes", "--force"]) == 0
    assert not list(store.list(layout.root))


def test_delete_of_a_damaged_run_names_force(store_uri, capsys):
    """A run whose records do not read cannot say whether its workers are live: refused, and the
    hint names --force, which deletes it (its store and name come from the flags)."""
    store = open_store(store_uri)
    layout = make_run(store, "broken", [[chat_request("b0", "q")]], model="m")
    for key in (layout.manifest, layout.spec):
        store.put(key, b"{{{ not a record")
        assert main(["delete", "--run", "broken", "--store", store_uri, "--yes"]) == 1
        err = capsys.readouterr().err
        assert "run 'broken' is damaged" in err and "hint: add --force" in err and "Traceback" not in err
    assert main(["delete", "--run", "broken", "--store", store_uri, "--yes", "--force"]) == 0
    assert not list(store.list(layout.root))


def test_runs_of_an_empty_store_says_so(tmp_path, capsys):
    assert main(["runs", "--store", str(tmp_path / "empty")]) == 0
    assert capsys.readouterr().out.strip() == f"no runs in {tmp_path / 'empty'}"


def test_logs_prints_each_workers_latest_log_and_follows_until_the_run_ends(tmp_path, capsys):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "r", [[chat_request("a", "q")]], model="m")
    logs = tmp_path / "store" / "logs" / "r"
    logs.mkdir(parents=True)
    (logs / "worker-0-1000.log").write_text("first attempt\n")
    (logs / "worker-0-2000.log").write_text("loading engine\n")
    (logs / "worker-1-1500.log").write_text("worker one\n")
    run = ["--run", "r", "--store", store_uri]
    assert main(["logs", *run]) == 0
    out = capsys.readouterr().out
    assert "loading engine" in out and "worker one" in out and "first attempt" not in out
    assert main(["logs", *run, "--worker", "0", "--all"]) == 0
    out = capsys.readouterr().out
    assert out.index("first attempt") < out.index("loading engine") and "worker one" not in out
    # --follow: lines written while a worker beats, then the end once it has exited.
    now = time.time()
    beats = HeartbeatPublisher(
        store, layout, Heartbeat(worker="0", holder="0.b", state="running", started_at=now, updated_at=now)
    )
    beats.publish()
    follow = threading.Thread(target=lambda: main(["logs", *run, "--worker", "0", "--follow", "--interval", "0.05"]))
    follow.start()
    with open(logs / "worker-0-2000.log", "a") as f:  # what the worker writes while it runs
        f.write("answered 1 row\n")
    # The worker exits once its line is read: follow must have printed it by then.
    deadline = time.monotonic() + 300  # a hang guard
    while "answered 1 row" not in capsys.readouterr().out and time.monotonic() < deadline:
        time.sleep(0.05)
    beats.publish(state="exited", updated_at=time.time())
    follow.join(60)
    assert not follow.is_alive()
    assert "is stopped: no worker is writing" in capsys.readouterr().err


def test_logs_of_a_run_without_logs_here_says_where_they_are(tmp_path, capsys):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "sky", [[chat_request("a", "q")]], model="m")

    def launched(rec):
        rec.backend = "skypilot"
        rec.worker(0).attempts.append(JobAttempt(job_id="7", backend="skypilot", launched_at=time.time()))

    update_jobs(store, layout, launched)
    assert main(["logs", "--run", "sky", "--store", store_uri]) == 5
    err = capsys.readouterr().err
    assert "ERROR no worker logs for run 'sky' on this machine" in err
    assert "hint: SkyPilot workers log on their machines: sky jobs logs JOB (worker 0: job 7)" in err


#: A worker's log as a CPU run writes it (shortened): orch's lines among vLLM's and torch's.
WORKER_LOG = """\
[orch worker] loading vllm engine for /models/tiny-llama
INFO orch.worker.vllm: vLLM KV cache: 907 MiB (model.kv_cache_fraction 0.05 of 17.7 GiB available at start)
(MainProcess pid=22188) WARNING 11-28 23:50:38 [arg_utils.py:1945] The global random seed is set to 0.
(MainProcess pid=22188) WARNING 11-28 23:50:39 [cpu.py:224] Triton is not installed.
/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: deprecated
  if hasattr(value, "__dict__"):
W1128 23:50:41.110000 22188 torch/_library/triton.py:53] Triton not available
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 15.41it/s]
[orch worker] part_00000: 10 rows
(MainProcess pid=22188) WARNING 11-28 23:51:00 [cpu_worker.py:140] CPU backend doesn't allow torch.set_num_threads
[orch worker] part_00000: done, 10 rows (0 errors) in 3.6s
ERROR worker 0: the store stayed unreachable
{"status": "SUCCESS", "requests": 10, "errors": 0}
"""


def test_logs_show_orchs_own_lines_first_and_leave_the_engines_out_on_request(tmp_path, capsys):
    """`orch logs` shows what the worker did before vLLM's warnings, in their order; --no-engine
    leaves the engine's lines out and says how many; the lines it calls orch's are those the
    worker writes (its progress prefix and its loggers' format)."""
    from orchestrator.runview.runs import is_orch_line
    from worker.progress import PREFIX

    store_uri = str(tmp_path / "store")
    make_run(open_store(store_uri), "r", [[chat_request("a", "q")]], model="m")
    logs = tmp_path / "store" / "logs" / "r"
    logs.mkdir(parents=True)
    (logs / "worker-0-1000.log").write_text(WORKER_LOG)
    ours = [line for line in WORKER_LOG.splitlines() if line.startswith(("[orch", "INFO orch", "ERROR w", "{"))]
    assert main(["logs", "--run", "r", "--store", store_uri]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1 : 1 + len(ours)] == ours  # after the log's name: orch's lines, in order
    assert out[1 + len(ours)] == "--- the engine's 7 lines (--no-engine leaves them out) ---"
    assert out[-1].startswith("(MainProcess pid=22188) WARNING 11-28 23:51:00")
    assert main(["logs", "--run", "r", "--store", store_uri, "--no-engine"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [*ours, "(and 7 lines of the engine's: orch logs without --no-engine shows them)"]
    assert is_orch_line(f"{PREFIX} part_00001: 3 rows") and is_orch_line("WARNING orch.worker: twin")
    assert not is_orch_line("(MainProcess pid=1) ERROR 11-28 [core.py:1] engine died")

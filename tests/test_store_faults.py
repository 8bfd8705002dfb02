"""A store that misbehaves: an endpoint that never answers, a frozen lock holder, a full disk, writers killed mid-write."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core.store import StoreBusy, open_store
from orchestrator.core.store.local import TMP_MAX_AGE_S, LocalStore
from tests.support.cli import orch
from tests.support.disks import small_tmpfs
from tests.support.events import wait_for
from tests.support.flaky_proxy import SilentServer
from tests.support.models import REPO


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR")]


def waited_on(silent: SilentServer, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """`orch ARGS` against the silent server, and the seconds from its first connection there to
    its exit: the network waits, not the start-up a loaded machine stretches."""
    started = time.monotonic()
    done = orch(*args, cwd=cwd, timeout=300)
    ended = time.monotonic()
    first = min((t for t in silent.connected_at if t >= started), default=None)
    assert first is not None, f"orch {' '.join(args)} never reached the server: {done.stderr}"
    return done, ended - first


@pytest.mark.slow
def test_status_on_an_endpoint_that_never_answers_fails_within_20s(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refusing = f"s3://bucket/prefix?endpoint=http://127.0.0.1:{closed.getsockname()[1]}"
    (tmp_path / "orch.yaml").write_text("store_settings:\n  attempts: 1\n")
    done = orch("status", "--run", "r", "--store", refusing, cwd=tmp_path, timeout=300)
    assert done.returncode != 0 and len(error_lines(done.stderr)) == 1, done.stderr
    (tmp_path / "orch.yaml").unlink()
    with SilentServer() as silent:
        store = f"s3://bucket/prefix?endpoint={silent.endpoint}"
        done, waited = waited_on(silent, "status", "--run", "r", "--store", store, cwd=tmp_path)
        assert done.returncode != 0
        # 2 tries of a 5 s connect and a 6 s read: 12 s of waiting at most, and some backoff.
        assert waited < 17, f"status waited {waited:.1f}s on the server"
        assert len(error_lines(done.stderr)) == 1 and "no answer" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        # The spec's store_settings bound it further.
        (tmp_path / "orch.yaml").write_text("store_settings:\n  read_timeout: 1\n  attempts: 1\n")
        done, waited = waited_on(silent, "status", "--run", "r", "--store", store, cwd=tmp_path)
        assert done.returncode != 0 and waited < 5, f"status waited {waited:.1f}s: {done.stderr}"
        # ...and an unknown key there is refused with file, line and field.
        (tmp_path / "orch.yaml").write_text("store_settings:\n  read_timeout: 1\n  retries: 1\n")
        done = orch("status", "--run", "r", "--store", store, cwd=tmp_path, timeout=120)
        assert done.returncode == 2 and "orch.yaml:3" in done.stderr and "store_settings.retries" in done.stderr


_HOLD_LOCK = """
import os, signal, sys
from orchestrator.core.store.local import LocalStore
store = LocalStore(sys.argv[1])
with store._lock(sys.argv[2]):
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen while holding the lock
"""


def test_local_store_lock_wait_is_bounded_and_names_the_frozen_holder(tmp_path):
    root = tmp_path / "store"
    key = "runs/r/leases/part_00000.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(root), key],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        store = LocalStore(root, lock_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(StoreBusy) as caught:
            store.put(key, b"x")
        assert time.monotonic() - started < 3
        message = str(caught.value)
        assert key in message and f"pid {holder.pid}" in message, message
        assert caught.value.hint and "lock_timeout" in caught.value.hint
        # Keys in other lock stripes are not held up at all.
        store.put("runs/r/leases/part_00001.json", b"y")
        # Once the holder moves on, the write goes through.
        holder.send_signal(signal.SIGCONT)
        assert holder.wait(10) == 0
        store.put(key, b"x")
        assert store.get(key).data == b"x"
    finally:
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        holder.wait()


_KILLED_WRITER = """
import sys
from orchestrator.core.store.local import LocalStore
LocalStore(sys.argv[1]).put_file("runs/r/chunks/part_00000.jsonl", sys.argv[2])  # blocks reading the FIFO
"""


def test_local_store_sweeps_temporary_files_left_by_killed_writers(tmp_path):
    root = tmp_path / "store"
    fifo = tmp_path / "feed"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(root), str(fifo)], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    with open(fifo, "wb") as feed:
        feed.write(b"x" * 4096)
        feed.flush()
        # The writer's imports take long on a loaded machine: wait for its file (or its death).
        wait_for(
            "the writer's temporary file", lambda: list((root / ".orch-tmp").glob("*")) or writer.poll() is not None
        )
        assert writer.poll() is None, "the writer never started its temporary file"
        writer.kill()  # mid-write: nothing can remove its temporary file now
        writer.wait()
    left = list((root / ".orch-tmp").iterdir())
    assert len(left) == 1
    LocalStore(root)
    assert left[0].exists(), "a fresh temporary file may belong to a write in progress: kept"
    old = time.time() - TMP_MAX_AGE_S - 60
    os.utime(left[0], (old, old))  # an hour later
    LocalStore(root)
    assert not left[0].exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 256 KiB (tmpfs), so writes fail with ENOSPC as on a full disk."""
    with small_tmpfs(tmp_path, "256k") as mount:
        yield mount


def test_prepare_on_a_full_disk_says_what_is_full_and_leaves_no_temporary_files(small_disk, tmp_path):
    data = tmp_path / "q.jsonl"
    with open(data, "w") as f:
        for i in range(3000):
            f.write(json.dumps({"id": f"q{i}", "conversation": [{"role": "user", "content": f"Q{i}? " * 8}]}) + "\n")
    store = small_disk / "store"
    done = orch(
        "prepare",
        str(data),
        "--run",
        "full",
        "--store",
        str(store),
        "--num-chunks",
        "4",
        "--id-column",
        "id",
        cwd=tmp_path,
    )
    assert done.returncode != 0
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "no space left" in errors[0] and str(store) in errors[0], done.stderr
    assert "hint: free space" in done.stderr and "Traceback" not in done.stderr
    assert list((store / ".orch-tmp").iterdir()) == []
    # The spec is recorded only once prepare succeeded: a retry after freeing space starts clean.
    assert open_store(store).head("runs/full/spec.yaml") is None

"""A SIGKILLed `orch collect` leaves nothing that the next collect does not remove, and a collect
running at the same moment loses nothing.

The collects are real `orch` processes. One is held at a known point, reading a chunk's output
part that is a FIFO: it blocks there, with its output's temporary file beside the output and its
folders in the temp dir, until the test writes the part's bytes (or kills it).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import DoneMarker, read_manifest
from orchestrator.core.store import open_store
from tests.support.datasets import write_jsonl
from tests.support.runs import Answer, answer_chunk, orch_process

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
#: A guard against a hang, not a pace: each wait ends at its event.
GUARD_S = 120


def answered_run(store_uri: str, workdir: Path, run: str, rows: int) -> None:
    """A run grouped by prefix (its lines are put back in input order through temporary files),
    every row answered."""
    write_jsonl(workdir / f"{run}.jsonl", [{"id": f"{run}{i}", "question": f"question {i}"} for i in range(rows)])
    flags = ["--format", "text", "--text-column", "question", "--id-column", "id", "--model", "m"]
    args = ["prepare", str(workdir / f"{run}.jsonl"), "--run", run, "--store", store_uri, *flags]
    assert main([*args, "--num-chunks", "2", "--group-by-prefix"]) == 0
    store, layout = open_store(store_uri), RunLayout(run)
    for entry in read_manifest(store, layout):
        ids = [json.loads(line)["custom_id"] for line in store.get(layout.chunk(entry.chunk)).data.splitlines()]
        answer_chunk(store, layout, entry.chunk, [[Answer(i, cid, f"answer {cid}") for i, cid in enumerate(ids)]])


class HeldPart:
    """The last chunk's output part replaced by a FIFO: a collect reading it waits for `release`."""

    def __init__(self, store_uri: str, run: str):
        store, layout = open_store(store_uri), RunLayout(run)
        last = read_manifest(store, layout)[-1].chunk
        key = DoneMarker.model_validate_json(store.get(layout.done(last)).data).parts[0].key
        self.path = Path(store_uri) / key
        self.data = self.path.read_bytes()
        self.path.unlink()
        os.mkfifo(self.path)

    def reader_waits(self) -> int:
        """Once a collect has opened the FIFO to read (it blocks there), a write end to it."""
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            try:
                return os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
            time.sleep(0.01)
        raise AssertionError(f"no collect opened {self.path} within {GUARD_S} s")

    def release(self, fd: int) -> None:
        os.set_blocking(fd, True)
        os.write(fd, self.data)
        os.close(fd)


def entries(folder: Path, start: str) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name.startswith(start)}


@pytest.mark.parametrize("kind", ["file", "delta"])
def test_collect_killed_leaves_what_the_next_collect_removes_and_a_live_collect_keeps_its_files(kind, tmp_path):
    store_uri = str(tmp_path / "store")
    temp, outs = tmp_path / "temp", tmp_path / "outs"
    temp.mkdir()
    outs.mkdir()
    for run, rows in (("live", 40), ("killed", 40), ("next", 6)):
        answered_run(store_uri, tmp_path, run, rows)

    def out(run: str) -> str:
        return {"file": str(outs / f"{run}.jsonl"), "delta": f"delta:{outs}/{run}"}[kind]

    def collect(run: str) -> subprocess.Popen[str]:
        args = ("collect", "--run", run, "--store", store_uri, "--out", out(run))
        return orch_process(tmp_path, *args, env={"TMPDIR": str(temp)})

    # 1. A collect that stays live, held half way: its files are there.
    live_part = HeldPart(store_uri, "live")
    live = collect("live")
    live_writer = live_part.reader_waits()
    live_in_temp, live_beside = entries(temp, "orch-collect-"), entries(outs, ".")
    folders = 1 if kind == "file" else 2  # input order's runs (and a table's rows before they are written)
    assert len(live_in_temp) == folders and len(live_beside) == (1 if kind == "file" else 0)

    # 2. Another, killed with SIGKILL half way, leaves its files.
    killed_part = HeldPart(store_uri, "killed")
    killed = collect("killed")
    killed_writer = killed_part.reader_waits()
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(GUARD_S) == -signal.SIGKILL
    os.close(killed_writer)
    left = len(entries(temp, "orch-collect-") - live_in_temp) + len(entries(outs, ".") - live_beside)
    assert left == folders + (1 if kind == "file" else 0)

    # 3. The next collect removes what the killed one left, and nothing of the live one's.
    following = collect("next")
    stdout, stderr = following.communicate(timeout=GUARD_S)
    assert following.returncode == 0, stderr
    assert f"removed {left} temporary file(s) or folder(s) that killed collects left" in stderr
    assert entries(temp, "orch-collect-") == live_in_temp and entries(outs, ".") == live_beside

    # 4. The live collect, released, finishes whole, and leaves nothing behind.
    live_part.release(live_writer)
    stdout, stderr = live.communicate(timeout=GUARD_S)
    assert live.returncode == 0, stderr
    assert "wrote 40 of 40 rows" in stdout and "removed" not in stderr
    assert entries(temp, "orch-collect-") == set() and entries(outs, ".") == set()
    if kind == "file":
        ids = [json.loads(line)["custom_id"] for line in Path(out("live")).read_text().splitlines()]
        assert ids == [f"live{i}" for i in range(40)]

"""orch and its workers as separate processes, as a user starts them: `orch` commands (waited for, or
in the background), workers started by hand, and what a test reads back from such a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.leases import read_lease
from orchestrator.core.store import open_store
from tests.support.models import REPO

ORCH = [sys.executable, "-m", "orchestrator"]
WORKER_PYTHON = str(REPO / ".venv-worker" / "bin" / "python")


def env_with(**extra: str) -> dict[str, str]:
    """This process's environment (the test's engine included), this checkout on PYTHONPATH, and `extra`."""
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def orch(
    *args: object, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`orch ARGS` in its own process, from `cwd`; its output captured."""
    return subprocess.run(
        [*ORCH, *map(str, args)], cwd=cwd, env=env or env_with(), capture_output=True, text=True, timeout=timeout
    )


def orch_ok(*args: object, cwd: Path, env: dict[str, str] | None = None) -> str:
    """`orch ARGS`, which must succeed; its standard output."""
    done = orch(*args, cwd=cwd, env=env)
    assert done.returncode == 0, f"orch {' '.join(map(str, args))}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Background:
    """An `orch` command running in the background, its output going to a file we can poll."""

    def __init__(self, *args: object, cwd: Path, env: dict[str, str] | None = None):
        self.out = cwd / f"orch-{time.monotonic_ns()}.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [*ORCH, *map(str, args)], cwd=cwd, env=env or env_with(), stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running after {timeout}s:\n{self.text[-3000:]}") from None


class HandWorker:
    """A worker started by hand, as a lost launch would have left it: no job records it. One
    thread, as the local launcher gives each of two workers (more only oversubscribes 2 cores)."""

    def __init__(self, store: str, run: str, worker: str, workdir: Path, **env: str):
        stamp = time.monotonic_ns()
        self.log, self.out = workdir / f"hand-{worker}-{stamp}.log", workdir / f"hand-{worker}-{stamp}.out"
        with open(self.log, "wb") as err, open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [WORKER_PYTHON, "-m", "worker", "--run", run, "--store", store, "--worker", worker],
                cwd=workdir,
                env=env_with(OMP_NUM_THREADS="1", **env),
                stdout=out,
                stderr=err,
            )

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads(self.out.read_text().splitlines()[-1])
        return summary


def questions(path: Path, n: int) -> Path:
    """`n` questions, q0 to q{n-1}, each a one-turn conversation under its `id`."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}?"}]}) + "\n")
    return path


def collect_lines(workdir: Path, run: str, store: str) -> list[dict[str, Any]]:
    """The run's output lines as `orch collect` writes them."""
    out = workdir / f"{run}.jsonl"
    orch_ok("collect", "--run", run, "--store", store, "--out", out, cwd=workdir)
    return [json.loads(line) for line in out.read_text().splitlines()]


def mid_chunk(store: str, run: str, gone: set[str]) -> list[tuple[str, str, bool]]:
    """(worker, holder, careful) of each live process working a chunk: its heartbeat says so and it
    holds that chunk's lease (`careful`: a holder of it died before). Processes in `gone` are dead
    (their last heartbeat still says running)."""
    client, layout = open_store(store), RunLayout(run)
    found = []
    for worker, beat in read_heartbeats(client, layout).items():
        if beat.state != "running" or not beat.chunk or beat.holder in gone:
            continue
        lease = read_lease(client, layout, beat.chunk)
        if lease is not None and lease[0].holder == beat.holder and not lease[0].released:
            found.append((worker, beat.holder, lease[0].crashes > 0))
    return found

"""The local backend: each worker is a process on this machine, logs in files. The default and the test bed.

Logs (and exit files) live beside the run when the store is a directory (`<store>/logs/<run>/`), so
any command finds them from any directory; with an S3/R2 store, in ORCH_HOME/logs/<run>/ here.
A failed job's reason quotes its log's last error line.

A job is a small shell that runs the worker with the worker environment's Python and then writes
the worker's exit code to a file, and exits with that code itself. The file is written at launch
with a placeholder, and the shell overwrites it in place: a disk filled while the worker ran
cannot keep the code out (rewriting allocated bytes needs no new block). A controller restarted
later (not the parent any more) still tells a clean exit, a crash and a kill apart:
- process alive (same PID and start time) -> RUNNING;
- exit file 0 -> SUCCEEDED; 143/130 (SIGTERM/SIGINT) -> CANCELLED; other codes -> FAILED;
- no code in the exit file: the shell's own exit status when this process is its parent; else
  (the shell was killed too, e.g. kill -9 of the process group) FAILED, with no code invented.
A failure on a disk that is full says so: the worker's log could not take its last error then.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.backends.base import JobState, JobStatus, LaunchRequest
from orchestrator.core.errors import LaunchFailed
from orchestrator.core.exits import WorkerExit
from orchestrator.core.home import orch_home
from orchestrator.core.processes import alive, runs, session_leader, start_ticks, started_at
from orchestrator.core.records import Heartbeat
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import Store
from orchestrator.core.store.local import LOGS_DIR, LocalStore

#: An exit file before its worker ends: room for any exit code, which the shell writes over it in place.
EXIT_PLACEHOLDER = b"?" + b" " * 7 + b"\n"
#: Less room than this left on the log folder's disk counts as full (a log line may not fit).
_FULL_BYTES = 64 * 1024
#: How much of a log's end is searched for its last error line.
_LOG_TAIL_BYTES = 64 * 1024
#: The last line of a Python traceback: the exception, e.g. `OSError: ...` or `vllm.x.SomeError: ...`.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def local_log_dir(spec: RunSpec, store: Store) -> Path:
    """Where the local backend keeps a run's worker logs: `<store>/logs/<run>` for a directory
    store, else ORCH_HOME (default ./.orch) / logs / <run>; always an absolute path."""
    base = store.root / LOGS_DIR if isinstance(store, LocalStore) else orch_home() / "logs"
    return (base / spec.layout.run).absolute()


def read_log_end(log: Path, nbytes: int = _LOG_TAIL_BYTES) -> str | None:
    """The last `nbytes` of a worker's log as text (None when it cannot be read)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - nbytes, 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def last_error_line(log: Path) -> str | None:
    """The line of a worker's log that says why it stopped: the last `ERROR` line (orch's own
    errors and logged failures), or the exception line that ends a traceback; None if neither."""
    return last_error_in(read_log_end(log) or "")


def last_error_in(text: str) -> str | None:
    """`last_error_line` of a log's text already read."""
    for line in reversed(re.split(r"[\r\n]+", text)):  # tqdm redraws with \r
        line = line.strip()
        if line.startswith("ERROR ") or _EXCEPTION_LINE.match(line):
            return line[:300]
    return None


def default_worker_python() -> str:
    """ORCH_WORKER_PYTHON, else the repository's .venv-worker, else this interpreter."""
    configured = os.environ.get("ORCH_WORKER_PYTHON")
    if configured:
        return configured
    repo_worker = Path(__file__).resolve().parents[2] / ".venv-worker" / "bin" / "python"
    return str(repo_worker) if repo_worker.exists() else sys.executable


class LocalLauncher:
    name = "local"

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        python: str | None = None,
        base_env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        workers: int = 1,
    ):
        self.log_dir = Path(log_dir).absolute()
        # Workers share this machine's cores: each gets its share of threads. Without this, every
        # vLLM CPU process sizes its thread pool for the whole machine and they thrash (measured on
        # 2 cores, SmolLM2: two workers at 40 tok/s each, against 125 each with one thread apiece).
        self.threads_per_worker = max(1, (os.cpu_count() or 1) // max(1, workers))
        self.python = python or default_worker_python()
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.cwd = str(cwd or os.getcwd())
        self.clock = clock

    # -- Launcher ----------------------------------------------------------------------------
    def launch(self, requests: Sequence[LaunchRequest]) -> dict[int, str]:
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LaunchFailed(
                {},
                {r.worker: f"cannot make its log folder {self.log_dir}: {e.strerror or e}" for r in requests},
                hint=f"the workers log to {self.log_dir}: make it a folder orch may write to",
            ) from None
        launched: dict[int, str] = {}
        failures: dict[int, str] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(requests)))) as pool:
            for request, outcome in zip(requests, pool.map(self._start_safely, requests), strict=True):
                if isinstance(outcome, str):
                    launched[request.worker] = outcome
                else:
                    failures[request.worker] = str(outcome)
        if failures:
            raise LaunchFailed(launched, failures, hint=f"check the worker Python: {self.python}")
        return launched

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return {job_id: self._status(job_id) for job_id in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        """SIGTERM to each job's process group (the worker flushes and gives its lease back), then
        SIGKILL to whatever is left after a grace period."""
        _terminate([pid for pid in (self._live_pid(j) for j in job_ids) if pid is not None], group=True)

    def find_strays(self, run: str, known: Sequence[str], beats: Sequence[Heartbeat]) -> dict[str, str]:  # noqa: ARG002 - the heartbeats are the run's already
        """Worker processes on this machine that heartbeat for the run and belong to no known job:
        their heartbeats name the pid, and the process's start time (from /proc) must match the
        heartbeat's. The handle is `pid-start ticks`, so a pid reused by then is never signalled."""
        ours = {pid for pid in (self._live_pid(j) for j in known) if pid is not None}
        host = socket.gethostname()
        strays: dict[int, str] = {}
        for beat in beats:
            pid = beat.pid
            if beat.host != host or pid is None or pid == os.getpid() or not alive(pid):
                continue
            if session_leader(pid) in ours:
                continue  # a known job's own worker: cancelled with its job
            started = started_at(pid)
            if started is None or not started - 5 <= beat.started_at <= started + 600:
                continue  # another process now has that pid
            strays[pid] = f"worker {beat.worker} (pid {pid}, holder {beat.holder})"
        return {f"{pid}-{start_ticks(pid)}": strays[pid] for pid in sorted(strays)}

    def stop_strays(self, handles: Sequence[str]) -> None:
        pids = [int(pid) for pid, _, ticks in (h.partition("-") for h in handles) if runs(int(pid), ticks)]
        _terminate(pids, group=False)

    # -- internals ---------------------------------------------------------------------------
    def _start_safely(self, request: LaunchRequest) -> str | Exception:
        try:
            return self._start(request)
        except OSError as e:
            return e

    def _start(self, request: LaunchRequest) -> str:
        stamp = f"{int(self.clock() * 1000)}"
        log = self.log_dir / f"worker-{request.worker}-{stamp}.log"
        exit_file = self.log_dir / f"worker-{request.worker}-{stamp}.exit"
        env = {
            "OMP_NUM_THREADS": str(self.threads_per_worker),
            **self.base_env,
            **request.envs,
            **request.secrets,
            "ORCH_EXIT_FILE": str(exit_file),
        }
        if request.use_spot is not None:
            env["ORCH_SPOT"] = "1" if request.use_spot else "0"
        # The shell outlives the worker to record its exit code, even when the worker is killed.
        # Its TERM/INT trap keeps it alive when the whole group is signalled (a trap with a command
        # is not inherited: the worker still gets the signal and flushes).
        # `1<>` opens the exit file without truncating it, so printf rewrites the placeholder's bytes.
        script = (
            f'trap "true" TERM INT; {shlex.quote(self.python)} -m worker; code=$?; '
            'printf "%-8s\\n" "$code" 1<>"$ORCH_EXIT_FILE"; exit $code'
        )
        exit_file.write_bytes(EXIT_PLACEHOLDER)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", script],
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        job_id = f"local-{proc.pid}-{start_ticks(proc.pid)}-{stamp}"
        # Keep the Popen object so this process reaps the child if it is the one watching.
        _CHILDREN[proc.pid] = proc
        return job_id

    def log_path(self, job_id: str) -> Path:
        _, _, _, stamp = job_id.split("-", 3)
        return next(self.log_dir.glob(f"worker-*-{stamp}.log"), self.log_dir / "missing.log")

    def _failed(
        self, job_id: str, why: str, started: float, *, code: int | None = None, ended: float | None = None
    ) -> JobStatus:
        """A FAILED job, its reason followed by its log's last error line."""
        log = self.log_path(job_id)
        error = last_error_line(log)
        return JobStatus(
            job_id,
            JobState.FAILED,
            failure_reason=f"{why}: {error}" if error else why,
            exit_code=code,
            started_at=started,
            ended_at=ended,
            log=str(log),
        )

    def _status(self, job_id: str) -> JobStatus:
        try:
            _, pid_text, ticks, stamp = job_id.split("-", 3)
            pid = int(pid_text)
        except ValueError:
            return JobStatus(job_id, JobState.UNKNOWN, failure_reason="not a local job id")
        started = int(stamp) / 1000
        log = str(self.log_path(job_id))
        child = _CHILDREN.get(pid)
        if child is not None:
            child.poll()  # reap, so a finished child does not linger as a zombie
        if runs(pid, ticks):
            return JobStatus(job_id, JobState.RUNNING, accelerator=None, spot=None, started_at=started, log=log)
        exit_file = next(self.log_dir.glob(f"worker-*-{stamp}.exit"), None)
        code = _recorded_code(exit_file)
        ended = exit_file.stat().st_mtime if exit_file is not None and code is not None else None
        if code is None and child is not None and child.returncode is not None:
            code = child.returncode  # the shell exits with the worker's code (negative: the shell was killed)
        if code is None:
            return self._failed(job_id, "killed (no exit code recorded)" + self._disk_note(), started)
        if code < 0:
            return self._failed(job_id, f"killed by signal {-code}" + self._disk_note(), started)
        if code == 0:
            return JobStatus(job_id, JobState.SUCCEEDED, exit_code=0, started_at=started, ended_at=ended, log=log)
        if code in (WorkerExit.STOPPED, WorkerExit.INTERRUPTED):
            return JobStatus(job_id, JobState.CANCELLED, exit_code=code, started_at=started, ended_at=ended, log=log)
        if code == WorkerExit.STORE_UNREACHABLE:
            why = f"worker exited with {code} (the store stayed unreachable past its outage budget)"
        elif 128 < code < 160:  # the shell reports a worker killed by signal N as 128 + N
            why = f"worker killed by signal {code - 128}"
        else:
            why = f"worker exited with {code}"
        return self._failed(job_id, why + self._disk_note(), started, code=code, ended=ended)

    def _disk_note(self) -> str:
        """That the log folder's disk is full (its log could not take the worker's last words), or nothing."""
        try:
            found = os.statvfs(self.log_dir)
        except OSError:
            return ""
        free = found.f_bavail * found.f_frsize
        return f"; the disk of {self.log_dir} is full ({free:,} bytes free)" if free < _FULL_BYTES else ""

    def _live_pid(self, job_id: str) -> int | None:
        try:
            _, pid_text, ticks, _ = job_id.split("-", 3)
        except ValueError:
            return None
        pid = int(pid_text)
        return pid if runs(pid, ticks) else None


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _recorded_code(exit_file: Path | None) -> int | None:
    """The exit code in a job's exit file; None while it holds the placeholder (or nothing readable)."""
    if exit_file is None:
        return None
    try:
        return int(exit_file.read_bytes().strip())
    except (OSError, ValueError):
        return None


def started_here() -> set[int]:
    """The pids (process groups) of the workers this process started that still run."""
    for child in _CHILDREN.values():
        child.poll()
    return {pid for pid, child in _CHILDREN.items() if child.returncode is None}


def stop_started_here(keep: Collection[int] = (), grace_s: float = 30.0) -> list[int]:
    """Stop the workers this process started that still run, but those in `keep` (for a process
    that must leave none behind: a test that timed out or failed mid-run); their pids."""
    pids = sorted(started_here() - set(keep))
    _terminate(pids, group=True, grace_s=grace_s)
    return pids


def _terminate(pids: list[int], *, group: bool, grace_s: float = 30.0) -> None:
    """SIGTERM (the worker flushes and gives its leases back), SIGKILL after the grace period."""
    kill = os.killpg if group else os.kill
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        for pid in pids:
            if (child := _CHILDREN.get(pid)) is not None:
                child.poll()  # reap our own children, or they stay "alive" as zombies
        pids = [pid for pid in pids if alive(pid)]
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)

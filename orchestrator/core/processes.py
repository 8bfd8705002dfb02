"""Processes on this machine, read from /proc: a pid with its start time names one process, so a
reused pid is never taken for the process that had it before.

The local backend names its jobs this way; a launch reservation names the controller that made
it (`this_process`), so another controller on the same machine can tell that it died (`gone`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: field 3 (state) is index 0; None when no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """The process runs (a zombie has ended)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot: with the pid, it names one process."""
    fields = stat_fields(pid)
    return fields[19] if fields else "gone"


def runs(pid: int, ticks: str) -> bool:
    """The process that `pid` and its `start_ticks` name still runs (not one that took its pid since)."""
    return start_ticks(pid) == ticks and alive(pid)


def started_at(pid: int) -> float | None:
    """When the process started, in seconds since the epoch (boot time + its start ticks)."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    try:
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, StopIteration):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def session_leader(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[3]) if fields else None


def this_process() -> str:
    """`host:pid:start ticks`: this process, as `gone` reads it on this machine."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{start_ticks(pid)}"


def gone(process: str) -> bool:
    """The process `this_process` named has ended. False where that cannot be told: it ran on
    another machine, or the name is not one `this_process` makes."""
    parts = process.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    return not runs(int(parts[1]), parts[2])

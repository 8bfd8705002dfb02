"""Temporary files that are renamed into place: made with the mode a plain `open()` gives, and named
after the process that made them, so that what a killed process left is found and removed.

`tempfile.mkstemp` makes files only their owner may read (0600), and a rename keeps that mode:
outputs and store objects written that way are closed to the teammates a shared folder or group
is for. These get 0666 less the umask, as any other file the user writes.

A process killed with SIGKILL (or by the OOM killer, or a power cut) removes nothing. So a
temporary name carries its maker, `<lead><pid>-<start ticks>-<host>.<random>` (core/processes.py:
a pid with its start time names one process, a reused pid never passes for the one before), and
`remove_abandoned` removes the names whose maker no longer runs on this machine: those of dead
processes, never those of a live one (another collect at the same moment), nor of another host
(a shared folder), nor names made any other way.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.core.processes import runs, start_ticks

#: The mark after a lead: pid, start ticks, host (letters, digits and '-'), then mkstemp's random part.
_MARK = re.compile(r"(\d+)-(\d+)-([A-Za-z0-9-]+)\.[A-Za-z0-9_]+")
#: What an AtomicFile's name puts between `.<name>.` and the mark (what `remove_abandoned_beside` looks for).
BESIDE_LEAD = "orch-"


def umask() -> int:
    """The process's umask, read without changing it (Linux: /proc; elsewhere set and put back)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "-"


def owned_prefix(lead: str) -> str:
    """`lead` and this process's mark: a name made with it is abandoned once this process ended."""
    pid = os.getpid()
    return f"{lead}{pid}-{start_ticks(pid)}-{_host()}."


def abandoned(name: str, lead: str) -> bool:
    """`name` was made with `owned_prefix(lead)` on this host, by a process that no longer runs."""
    found = _MARK.fullmatch(name[len(lead) :]) if name.startswith(lead) else None
    if found is None:
        return False
    pid, ticks, host = found.groups()
    return host == _host() and not runs(int(pid), ticks)


@dataclass(frozen=True)
class Removed:
    """A file or folder a killed process left, removed."""

    path: str
    bytes: int


def owned_temp_dir(lead: str, directory: str | None = None) -> str:
    """`tempfile.mkdtemp` (in the temp dir, TMPDIR, by default) under a name `remove_abandoned` knows."""
    return tempfile.mkdtemp(prefix=owned_prefix(lead), dir=directory)


def remove_abandoned(directory: str, lead: str) -> list[Removed]:
    """Remove the entries of `directory` that `owned_prefix(lead)` named for processes now dead."""
    return _remove(directory, lambda name: abandoned(name, lead))


def remove_abandoned_beside(path: str | os.PathLike[str]) -> list[Removed]:
    """Remove the AtomicFiles that dead processes left in `path`'s folder (any name's, not only `path`'s)."""

    def left(name: str) -> bool:
        cut = name.rfind(f".{BESIDE_LEAD}")  # the mark's host has no '.': the last one starts the mark
        return name.startswith(".") and cut > 0 and abandoned(name, name[: cut + 1 + len(BESIDE_LEAD)])

    return _remove(os.path.dirname(os.path.abspath(path)), left)


def _remove(directory: str, left: Callable[[str], bool]) -> list[Removed]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:  # not there (yet), or not ours to read: nothing of ours to remove
        return []
    removed = []
    for name in filter(left, names):
        path = os.path.join(directory, name)
        size = tree_bytes(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:  # another process removed it first, or it is not ours: left as it is
            continue
        removed.append(Removed(path, size))
    return removed


def tree_bytes(path: str) -> int:
    """The bytes of a file, or of every file under a folder (links not followed)."""
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(OSError):
            return os.lstat(path).st_size
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def make_temp(directory: str | os.PathLike[str], prefix: str = "") -> tuple[int, str]:
    """`tempfile.mkstemp` in `directory`, with the mode a new file of the user's would have."""
    fd, path = tempfile.mkstemp(dir=directory, prefix=prefix)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, path


class AtomicFile:
    """A user's output file, written under a temporary name beside it and renamed into place only
    when the writing succeeded: a failure (or `discard()`) leaves neither a partial file nor the
    temporary one, and whatever good file had the name before stays as it was. The temporary
    name, `.<name>.orch-<mark>`, is one `remove_abandoned_beside` removes once its process died.

    `OSError`s from making the temporary file or from the rename propagate; callers turn them into
    their own message (they know the option that named the path)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        directory, name = os.path.split(os.path.abspath(self.path))
        fd, self.tmp = make_temp(directory, prefix=owned_prefix(f".{name}.{BESIDE_LEAD}"))
        self.file = os.fdopen(fd, "wb")
        self.keep = True

    def discard(self) -> None:
        """Do not publish the file, even if the writing ends well."""
        self.keep = False

    def close(self) -> None:
        """Rename into place (unless discarded); the temporary file is gone afterwards in every case."""
        try:
            self.file.close()
            if self.keep:
                os.replace(self.tmp, self.path)
        finally:
            self.keep = False
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self.discard()
        self.close()

"""The server's own temp folder for uploads in flight, and the removal of what killed servers left.

Every `orch serve` on this machine spools uploads under one folder of the temp dir, one per user:

    $TMPDIR/orch-serve-uploads-<uid>/server-<pid>-<random>/orch-upload-*   a server's uploads in flight
    $TMPDIR/orch-serve-uploads-<uid>/server-<pid>-<random>/.lock           locked while that server lives

A server stopped normally removes its folder (app.py, at shutdown). One killed (SIGKILL, OOM, a
power cut) cannot; its lock dies with it, though, since the kernel releases a dead process's flock.
So each server, as it starts, removes every folder whose lock it can take: those of dead servers,
never those of others still serving. One lock on the parent folder orders these removals with the
creation of a new folder (a folder is locked before any other server can see it unlocked).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.core.errors import OrchError
from orchestrator.core.tempfiles import tree_bytes

log = logging.getLogger("orch.serve")

#: The lock file in each server's folder, and in the parent folder.
LOCK = ".lock"
#: A server's folder name starts so (its pid follows: a reader can tell whose it was).
SERVER_PREFIX = "server-"


@dataclass(frozen=True)
class Spool:
    #: The server's folder: uploads are spooled here while they arrive.
    path: str
    #: The open lock file of the folder, locked while the server lives.
    lock_fd: int

    def close(self) -> None:
        """Remove the folder with whatever uploads cut off at shutdown left in it."""
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock_fd)


def spool_parent(temp_dir: str | None = None) -> str:
    """This user's folder of server folders, in the temp dir (TMPDIR)."""
    return os.path.join(temp_dir or tempfile.gettempdir(), f"orch-serve-uploads-{os.getuid()}")


def open_spool(temp_dir: str | None = None) -> Spool:
    """1. Make (or find) this user's parent folder, private, and lock it.
    2. Remove the folders of servers that died (their locks are free), saying what was removed.
    3. Make this server's folder and lock it, before the parent's lock is released."""
    parent = spool_parent(temp_dir)
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    except OSError as e:
        if not os.path.lexists(parent):  # else something else is there: _check_private says what
            raise OrchError(
                f"cannot make {parent}: {e.strerror or e}", hint="point TMPDIR at a folder this user can write"
            ) from None
    _check_private(parent)
    with _locked(os.path.join(parent, LOCK)):
        _remove_abandoned(parent)
        path = tempfile.mkdtemp(prefix=f"{SERVER_PREFIX}{os.getpid()}-", dir=parent)
        fd = os.open(os.path.join(path, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return Spool(path, fd)


def _check_private(parent: str) -> None:
    """The parent must be this user's own directory: another user could otherwise read uploads."""
    found = os.lstat(parent)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise OrchError(
            f"{parent} is not a directory of this user: orch serve will not spool uploads there",
            hint="remove it, or point TMPDIR elsewhere",
        )


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _remove_abandoned(parent: str) -> None:
    for name in sorted(os.listdir(parent)):
        folder = os.path.join(parent, name)
        if not name.startswith(SERVER_PREFIX) or not _abandoned(folder):
            continue
        left = tree_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed %s: %d byte(s) of uploads left by a server that was killed", folder, left)


def _abandoned(folder: str) -> bool:
    """No live server holds the folder's lock (or it never got one)."""
    try:
        fd = os.open(os.path.join(folder, LOCK), os.O_RDWR)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not ours to judge (a file, say): left alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True

"""A run store in a local directory, with the same atomicity as S3 conditional writes.

1. Every write goes to a temporary file in the same file system, then appears at once:
   `os.replace` for plain writes, `os.link` (fails if the name exists) for put-if-absent.
2. Writes to a key hold an exclusive `flock` on one of a fixed set of lock files picked by the
   key's hash, so a compare-and-swap's check and replace cannot interleave with another write,
   whether it comes from a thread or from another process. A lock is waited for at most
   `lock_timeout` seconds (a frozen holder must not stop every other process); its holder writes
   who it is into the lock file, so the error can name it.
3. The ETag is the MD5 of the bytes, like a single-part S3 upload (so, as on S3, writing back
   identical bytes gives the same ETag: writers of conditional objects make their bytes unique).
4. A write that fails (a full disk) removes its temporary file; temporary files older than
   TMP_MAX_AGE_S, left by processes killed mid-write, are swept when the store is opened.
   A full file system is `StoreFull`, naming the directory: a condition to wait out, not a crash.
Opening a store creates nothing: its directories appear with the first write, so reading a
mistyped path (`orch status --store /typo`) leaves no trace. A directory orch may not read or
write is a StoreError naming it, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Concatenate, ParamSpec, TypeVar

from orchestrator.core.errors import InvalidKey, NotFound, PreconditionFailed, StoreBusy, StoreError, StoreFull
from orchestrator.core.store.base import (
    LIST_PAGE_SIZE,
    Blob,
    ObjectInfo,
    RequestCounter,
    check_key,
)
from orchestrator.core.tempfiles import make_temp

#: The local backend's worker logs, beside the runs (orchestrator/backends/local.py): files of this
#: machine, not store keys.
LOGS_DIR = "logs"
_INTERNAL = (".orch-tmp", ".orch-locks", LOGS_DIR)
_LOCK_STRIPES = 256
#: A temporary file this old belongs to no write in progress: its writer was killed.
TMP_MAX_AGE_S = 3600.0
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: Less free space than this under a local store is a full disk (`check_space`): no flush fits.
MIN_FREE_BYTES = 64 * 1024


P = ParamSpec("P")
T = TypeVar("T")


def _guarded(
    doing: str,
) -> Callable[[Callable[Concatenate[LocalStore, P], T]], Callable[Concatenate[LocalStore, P], T]]:
    """A store method whose permission errors become StoreErrors (see _permission)."""

    def wrap(method: Callable[Concatenate[LocalStore, P], T]) -> Callable[Concatenate[LocalStore, P], T]:
        def guarded(self: LocalStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
            with _permission(self.root, doing):
                return method(self, *args, **kwargs)

        functools.update_wrapper(guarded, method)
        return guarded

    return wrap


@contextlib.contextmanager
def _permission(root: Path, doing: str) -> Iterator[None]:
    """A directory orch may not use (permissions, a read-only file system) as a StoreError."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise StoreError(
            f"cannot {doing} the store at {root}: {e.strerror}" + (f" ({e.filename})" if e.filename else ""),
            hint="check --store (or ORCH_STORE, or `store:` in orch.yaml), and that the directory is yours to use",
        ) from None


def _check_not_a_file(root: Path) -> None:
    """A store is a directory (made at the first write): a path that is a file, or lies under one,
    is named at once rather than read as an empty store or failing at the first write."""
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None or existing.is_dir():
        return
    where = "is a file" if existing == root else f"lies under {existing}, which is a file"
    raise StoreError(
        f"the store {root} {where}",
        hint="--store (or ORCH_STORE, or `store:` in orch.yaml) names a directory; it is created if missing",
    )


class LocalStore:
    shared = False

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 30.0):
        self.root = Path(root).absolute()
        self.uri = str(self.root)
        _check_not_a_file(self.root)
        self.requests = RequestCounter()
        self.lock_timeout = lock_timeout
        self._tmp = self.root / ".orch-tmp"
        self._locks = self.root / ".orch-locks"
        self._ready = False
        self._sweep_tmp()  # creates nothing: only what an earlier writer left

    def _own_dirs(self) -> None:
        """The store's own directories, made at the first write."""
        if not self._ready:
            with _permission(self.root, "write to"):
                for d in (self._tmp, self._locks):
                    d.mkdir(parents=True, exist_ok=True)
            self._ready = True

    # -- reads -------------------------------------------------------------------------------
    @_guarded("read")
    def get(self, key: str) -> Blob:
        self.requests.add("get")
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(key) from None
        return Blob(data, _etag(data))

    @_guarded("read")
    def head(self, key: str) -> ObjectInfo | None:
        self.requests.add("head")
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        base = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        keys: list[tuple[str, os.stat_result]] = []
        for dirpath, dirnames, filenames in os.walk(base):
            if Path(dirpath) == self.root:
                dirnames[:] = [d for d in dirnames if d not in _INTERNAL]
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix) and (start_after is None or key.encode() > start_after.encode()):
                    with contextlib.suppress(FileNotFoundError):
                        keys.append((key, os.stat(os.path.join(dirpath, name))))
        keys.sort(key=lambda item: item[0].encode())
        self.requests.add("list")  # the first page is a request even when empty
        for i, (key, st) in enumerate(keys):
            if i and i % LIST_PAGE_SIZE == 0:
                self.requests.add("list")
            yield ObjectInfo(key, st.st_size, st.st_mtime)

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        self.requests.add("get")
        try:
            f = open(self._path(key), "rb")  # noqa: SIM115 - closed by the `with` below, after NotFound is told apart
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(key) from None
        with f:
            yield f

    def check_space(self) -> None:
        """StoreFull when the file system under the store is (nearly) full: from statvfs, writing nothing."""
        at = next((p for p in (self.root, *self.root.parents) if p.exists()), self.root)
        with contextlib.suppress(OSError):
            st = os.statvfs(at)
            free = st.f_bavail * st.f_frsize
            if free < MIN_FREE_BYTES:
                raise StoreFull(
                    f"no space left on the file system under {self.root} ({free:,} bytes free): workers cannot flush",
                    hint=f"free space there (df -h {at}), or move the store; nothing written so far is lost",
                )

    # -- writes ------------------------------------------------------------------------------
    @_guarded("write to")
    def put(self, key: str, data: bytes) -> str:
        self.requests.add("put")
        path = self._path(key)
        with self._tmp_file(key) as tmp:
            _write_all(tmp, data)
            with self._lock(key):
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, path)
        return _etag(data)

    @_guarded("write to")
    def put_file(self, key: str, path: str) -> None:
        self.requests.add("put")
        target = self._path(key)
        with self._tmp_file(key) as tmp:
            with open(tmp, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            with self._lock(key):
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, target)

    @_guarded("write to")
    def put_if_absent(self, key: str, data: bytes) -> str:
        self.requests.add("put_if_absent")
        path = self._path(key)
        with self._tmp_file(key) as tmp:
            _write_all(tmp, data)
            with self._lock(key):
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailed(key) from None
        return _etag(data)

    @_guarded("write to")
    def compare_and_swap(self, key: str, data: bytes, etag: str) -> str:
        self.requests.add("compare_and_swap")
        path = self._path(key)
        with self._tmp_file(key) as tmp:
            _write_all(tmp, data)
            with self._lock(key):
                try:
                    current = _etag(path.read_bytes())
                except FileNotFoundError:
                    raise PreconditionFailed(key) from None
                if current != etag:
                    raise PreconditionFailed(key)
                os.replace(tmp, path)
        return _etag(data)

    @_guarded("write to")
    def delete(self, key: str) -> None:
        self.requests.add("delete")
        with self._lock(key), contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    # -- internals ---------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        check_key(key)
        if key.split("/", 1)[0] in _INTERNAL:
            raise InvalidKey(f"invalid store key {key!r}: {key.split('/', 1)[0]} is the store's own")
        return self.root / key

    @contextlib.contextmanager
    def _tmp_file(self, key: str) -> Iterator[str]:
        """A temporary file for one write, removed whatever happens (renamed into place on
        success); a full disk becomes StoreFull naming the key and the directory."""
        tmp = None
        try:
            self._own_dirs()
            fd, tmp = make_temp(self._tmp)
            os.close(fd)
            yield tmp
        except OSError as e:
            if e.errno in _FULL:
                raise StoreFull(
                    f"no space left on the file system under {self.root} (writing {key})",
                    hint=f"free space there (df -h {self.root}), or move the store; nothing written so far is lost",
                ) from None
            raise
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _sweep_tmp(self) -> None:
        """Remove temporary files that no write in progress can own (their writers were killed)."""
        cutoff = time.time() - TMP_MAX_AGE_S
        with contextlib.suppress(OSError), os.scandir(self._tmp) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_file() and entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        """The key's write lock, waited for at most `lock_timeout` seconds (StoreBusy then, naming
        the holder its lock file names)."""
        self._own_dirs()
        stripe = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=2).digest(), "big")
        lock_path = self._locks / f"{stripe % _LOCK_STRIPES:03d}"
        # A separate open file description per call: flock then excludes other threads too.
        with open(lock_path, "a+b") as lock:
            deadline = time.monotonic() + self.lock_timeout
            pause = 0.001
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreBusy(
                            f"waited {self.lock_timeout:g}s for the write lock of {key!r} ({lock_path}), "
                            f"held by {_holder(lock_path)}",
                            where=self.uri,
                            hint="that process is frozen or stuck on a slow disk: resume or stop it "
                            "(store_settings.lock_timeout sets the wait)",
                        ) from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
            try:
                # Who holds it, for the error another process may have to show.
                with contextlib.suppress(OSError):
                    lock.truncate(0)
                    lock.write(
                        f"pid {os.getpid()} on {socket.gethostname()} since {time.time():.3f} for {key}".encode()
                    )
                    lock.flush()
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _write_all(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _holder(lock_path: Path) -> str:
    """What the lock's holder wrote into it: `pid N on HOST since T for KEY`."""
    try:
        text = lock_path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    if not text.startswith("pid "):
        return "an unknown process"
    words = text.split(" ")
    with contextlib.suppress(ValueError, IndexError):
        since = float(words[5])
        words[5] = time.strftime("%H:%M:%S", time.localtime(since)) + f" ({time.time() - since:.0f}s ago)"
    return " ".join(words)


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()

"""Temporary files that are renamed into place: made with the mode a plain `open()` gives.

`tempfile.mkstemp` makes files only their owner may read (0600), and a rename keeps that mode:
outputs and store objects written that way are closed to the teammates a shared folder or group
is for. These get 0666 less the umask, as any other file the user writes.
"""

from __future__ import annotations

import os
import tempfile


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
    temporary one, and whatever good file had the name before stays as it was.

    `OSError`s from making the temporary file or from the rename propagate; callers turn them into
    their own message (they know the option that named the path)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        directory, name = os.path.split(os.path.abspath(self.path))
        fd, self.tmp = make_temp(directory, prefix=f".{name}.")
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

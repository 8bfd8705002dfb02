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

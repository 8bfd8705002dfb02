"""The SHA-256 of a local file's bytes, computed once and remembered while the file stays as it was.

Reuse keys a model by the content of every one of its files (prepare/answers/answer_keys.py), weights
included: a fine-tune saved over another of the same size must not pass for it. Hashing a few GB
at every prepare would cost seconds, so a digest is kept in a small cache, valid while the file's
device, inode, size, modification and change times are those it was computed for. The change time
(ctime) is set by the kernel on every write and cannot be set back by a user (as `cp -p` or
`touch -d` set mtime), so a rewritten file is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

#: Read in blocks of this size: hashing runs at memory speed (SHA-NI) and memory stays flat.
BLOCK = 1 << 20
#: Cache entries kept at most (the oldest dropped first): a few hundred model files are typical.
MAX_ENTRIES = 4096


def cache_path() -> Path:
    """Where digests are remembered: $ORCH_DIGEST_CACHE, else the user's cache folder."""
    given = os.environ.get("ORCH_DIGEST_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orch" / "file-digests.json"


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of the file's bytes, from the cache when the file has not changed since."""
    path = path.resolve()
    stat = path.stat()
    stamp = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
    cache = _read_cache()
    entry = cache.get(str(path))
    if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
        return str(entry["sha256"])
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    value = digest.hexdigest()
    cache.pop(str(path), None)
    cache[str(path)] = {"stamp": stamp, "sha256": value}
    _write_cache(dict(list(cache.items())[-MAX_ENTRIES:]))
    return value


def _read_cache() -> dict[str, object]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}  # no cache yet, or a damaged one: digests are computed again
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict[str, object]) -> None:
    """Replace the cache file whole (a temporary file renamed over it), so a reader never sees half
    of it; two writers at once lose one's new entry, which is computed again next time."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".file-digests-", dir=path.parent)
    except OSError:
        return  # a read-only home: the digest is still right, only not remembered
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)

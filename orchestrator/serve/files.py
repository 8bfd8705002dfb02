"""Files in the store: uploads and a batch's output and error files, each with its owner's index entry."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from orchestrator.core.layout import ServeLayout
from orchestrator.core.records import FilePurpose, StoredFile, read_file_record
from orchestrator.core.store import Store

LAYOUT = ServeLayout()
_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def save_file(
    store: Store,
    *,
    owner: str,
    filename: str,
    purpose: FilePurpose,
    path: str | os.PathLike[str],
    file_id: str | None = None,
    created_ms: int | None = None,
) -> StoredFile:
    """Store a file, visible to its owner once complete.

    1. The bytes, 2. the document, 3. the owner's index entry: a file that can be listed or read
    always has its bytes. Given the same id and time, saving again writes the same keys (a batch's
    output files, written again by a server restarted halfway).
    """
    file_id = file_id or new_file_id()
    created_ms = created_ms if created_ms is not None else int(time.time() * 1000)
    store.put_file(LAYOUT.file_content(file_id), str(path))
    record = StoredFile(
        id=file_id,
        owner=owner,
        filename=filename,
        purpose=purpose,
        bytes=os.path.getsize(path),
        created_at=created_ms // 1000,
        created_ms=created_ms,
    )
    store.put(LAYOUT.file(file_id), record.to_bytes())
    store.put(LAYOUT.owned(owner, "files", created_ms, file_id), b"")
    return record


def owned_file(store: Store, owner: str, file_id: str) -> StoredFile | None:
    """The file, if it exists and belongs to `owner` (another owner's file is as good as absent)."""
    record = read_file_record(store, LAYOUT, file_id) if valid_id(file_id) else None
    return record if record is not None and record.owner == owner else None


def list_files(
    store: Store, owner: str, *, after: StoredFile | None, limit: int, newest_first: bool, purpose: str | None
) -> tuple[list[StoredFile], bool]:
    """A page of the owner's files and whether more follow, from the owner's index."""
    prefix = LAYOUT.owned_prefix(owner, "files")
    keys = [info.key for info in store.list(prefix)]
    keys.sort(reverse=not newest_first)
    if after is not None:
        mark = LAYOUT.owned(owner, "files", after.created_ms, after.id)
        keys = [k for k in keys if (k > mark if newest_first else k < mark)]
    page: list[StoredFile] = []
    for key in keys:
        record = read_file_record(store, LAYOUT, LAYOUT.id_of(key))
        if record is None or (purpose is not None and record.purpose != purpose):
            continue  # deleted a moment ago, or filtered out
        if len(page) == limit:
            return page, True
        page.append(record)
    return page, False


def delete_file(store: Store, record: StoredFile) -> None:
    """The index entry first: a file being deleted is no longer listed, then no longer there."""
    store.delete(LAYOUT.owned(record.owner, "files", record.created_ms, record.id))
    store.delete(LAYOUT.file(record.id))
    store.delete(LAYOUT.file_content(record.id))


def iter_content(store: Store, record: StoredFile, block: int = 1 << 20) -> Iterator[bytes]:
    with store.open(LAYOUT.file_content(record.id)) as f:
        while data := f.read(block):
            yield data


def file_object(record: StoredFile) -> dict[str, Any]:
    """The OpenAI file object."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def valid_id(object_id: str) -> bool:
    """Ids become parts of store keys: ASCII letters, digits, '-' and '_' only."""
    return _ID.fullmatch(object_id) is not None

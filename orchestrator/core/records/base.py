"""What every stored document is built on: one reader, one read-change-write loop, JSON lines."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import CorruptRecord, StoreContention
from orchestrator.core.layout import decode_key_record
from orchestrator.core.store import NotFound, PreconditionFailed, Store

#: How often `cas_update` re-reads and re-applies a change another writer raced (backing off up to 1 s).
CAS_ATTEMPTS = 32


class Record(BaseModel):
    """Records tolerate unknown fields, so an older orch can read what a newer one wrote."""

    model_config = ConfigDict(extra="ignore")

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls: type[R], data: bytes) -> R:
        return cls.model_validate_json(data)


R = TypeVar("R", bound=Record)
K = TypeVar("K", bound="KeyRecord")
D = TypeVar("D", bound="Document")


class Document(Record):
    """A record updated in place by compare-and-swap (`cas_update`).

    Every write stamps a fresh `write_id`, so no two writes have the same bytes: an S3 store whose
    conditional write was retried reads the object back and counts identical bytes as its own earlier
    success (store/s3.py); two writers making the same change must not both be told they won.
    """

    write_id: str = Field("", description="unique to each write (see the class docstring)")


class KeyRecord(Record):
    """A record small enough to live in a key name (see layout.encode_key_record): its fields, in
    declaration order, are the positions of the encoded values. Add fields only at the end."""

    def key_values(self) -> list[Any]:
        return [getattr(self, name) for name in type(self).model_fields]

    @classmethod
    def from_key(cls: type[K], text: str) -> K:
        return cls.model_validate(decode_key_record(text, tuple(cls.model_fields)))


def parse_record(cls: type[R], data: bytes, where: str) -> R:
    """The document in `data`; CorruptRecord (naming `where`) when it is not one."""
    try:
        return cls.from_bytes(data)
    except (ValidationError, ValueError, yaml.YAMLError) as e:
        raise CorruptRecord(
            f"not a valid {cls.__name__}: {_first_error(e)}",
            where=where,
            hint="the object was written by something other than orch, or truncated; inspect or delete it",
        ) from None


def read_record(store: Store, key: str, cls: type[R]) -> tuple[R, str] | None:
    """The document at `key` and its ETag (for a later compare-and-swap), or None when absent."""
    try:
        blob = store.get(key)
    except NotFound:
        return None
    return parse_record(cls, blob.data, key), blob.etag


def cas_update(
    store: Store,
    key: str,
    cls: type[D],
    change: Callable[[D | None], D | None],
    *,
    expect_new: bool = False,
) -> tuple[D | None, str | None]:
    """Read the document, apply `change`, write the result back; returns what is stored then, and its ETag.

    1. Read the document (None when absent). With `expect_new` the first round skips the read
       and assumes there is none (a claim of an untouched chunk: one request instead of two).
    2. `change` returns the new document, or None to write nothing (the current one stands).
    3. Write it: create-if-absent for a new document, compare-and-swap on the ETag otherwise.
    4. Another writer came first (412): back off a little, then from 1 again, with its write seen.
       Except after the first round of `expect_new`: the document was there already (a claim of
       a chunk someone holds), a wrong guess rather than a collision, so it is read at once.
    """
    for attempt in range(CAS_ATTEMPTS):
        current = None if expect_new and attempt == 0 else read_record(store, key, cls)
        old, etag = current if current is not None else (None, None)
        new = change(old.model_copy(deep=True) if old is not None else None)
        if new is None:
            return old, etag
        new = new.model_copy(update={"write_id": os.urandom(16).hex()})  # 128 random bits, as uuid4 has 122
        data = new.to_bytes()
        try:
            etag = store.put_if_absent(key, data) if etag is None else store.compare_and_swap(key, data, etag)
            return new, etag
        except PreconditionFailed:
            if expect_new and attempt == 0:
                continue
            # Full jitter, doubling: racing writers spread out instead of colliding again.
            time.sleep(random.uniform(0, min(1.0, 0.005 * 2**attempt)))
    raise StoreContention(
        f"the document kept changing under us ({CAS_ATTEMPTS} attempts)",
        where=key,
        hint="many controllers are writing it at once; try again",
    )


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        return f"{loc}: {err.get('msg')}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def read_jsonl(cls: type[R], data: bytes, where: str) -> list[R]:
    return list(iter_jsonl(cls, data.splitlines(), where))


def iter_jsonl(cls: type[R], lines: Iterable[bytes], where: str) -> Iterator[R]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield parse_record(cls, line, f"{where}:{number}")


def write_jsonl(records: Iterable[Record]) -> bytes:
    return b"".join(r.to_bytes() + b"\n" for r in records)


def dumps(obj: Any) -> bytes:
    """Canonical JSON for what is not a record (hash inputs, small indexes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

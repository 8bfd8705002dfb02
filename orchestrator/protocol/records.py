"""The records workers and the controller exchange through the store, and how they are (de)serialised."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import OrchError


class Record(BaseModel):
    """Records tolerate unknown fields, so an older orch can read what a newer worker wrote."""

    model_config = ConfigDict(extra="ignore")

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


R = TypeVar("R", bound=Record)
K = TypeVar("K", bound="KeyRecord")


class KeyRecord(Record):
    """A record small enough to live in a key name (see layout.encode_key_record): its fields, in
    declaration order, are the positions of the encoded values. Add fields only at the end."""

    def key_values(self) -> list[Any]:
        return [getattr(self, name) for name in type(self).model_fields]

    @classmethod
    def from_key(cls: type[K], text: str) -> K:
        from orchestrator.protocol.layout import decode_key_record

        return cls.model_validate(decode_key_record(text, tuple(cls.model_fields)))


class CorruptRecord(OrchError):
    """An object in the store does not parse as the record its key says it is."""


def parse_record(cls: type[R], data: bytes, where: str) -> R:
    try:
        return cls.model_validate_json(data)
    except ValidationError as e:
        raise CorruptRecord(
            f"not a valid {cls.__name__}: {_first_error(e)}",
            where=where,
            hint="the object was written by something other than orch, or truncated; inspect or delete it",
        ) from None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    return f"{loc}: {err.get('msg')}"


# -- written by prepare and plan ----------------------------------------------------------------
class ManifestEntry(Record):
    """One chunk of canonical requests."""

    chunk: str = Field(description="chunk id, e.g. part_00042")
    key: str = Field(description="path of the chunk file relative to the run")
    rows: int
    bytes: int
    est_prompt_tokens: int = Field(description="prompt tokens estimated from characters")
    max_output_tokens: int = Field(description="sum over rows of max_tokens x n: an upper bound")

    @property
    def est_tokens(self) -> int:
        """The work estimate the planner balances: prompt tokens plus the output budget."""
        return self.est_prompt_tokens + self.max_output_tokens


def read_jsonl(cls: type[R], data: bytes, where: str) -> list[R]:
    return list(iter_jsonl(cls, data.splitlines(), where))


def iter_jsonl(cls: type[R], lines: Iterable[bytes], where: str) -> Iterator[R]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield parse_record(cls, line, f"{where}:{number}")


def write_jsonl(records: Iterable[Record]) -> bytes:
    return b"".join(r.to_bytes() + b"\n" for r in records)


class WorkerAssignment(Record):
    worker: int
    chunks: list[str]
    rows: int
    est_tokens: int


class PlanRecord(Record):
    workers: list[WorkerAssignment]
    chunks: int
    rows: int
    est_tokens: int
    created_at: float


# -- written by workers -------------------------------------------------------------------------
class Lease(Record):
    """Who works on a chunk, until when. `holder` is unique to one worker process."""

    chunk: str
    worker: str
    holder: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    released: bool = False

    def is_free(self, now: float) -> bool:
        return self.released or self.expires_at <= now


class PartRef(Record):
    """One checkpointed output object, as a done marker lists it."""

    key: str
    rows: int
    errors: int
    bytes: int
    sha256: str


class DoneMarker(Record):
    """The success marker: the authoritative list of a chunk's outputs. Written last, create-if-absent."""

    chunk: str
    parts: list[PartRef]
    rows: int
    errors: int
    worker: str
    holder: str
    accelerator: str | None = None
    model: str
    spec_hash: str
    started_at: float
    finished_at: float
    tokens_in: int
    tokens_out: int
    output_format: Literal["jsonl", "parquet"] = "jsonl"

    def stats(self) -> ChunkStats:
        """What `status` and the claimers read from the stats listing instead of this marker's body."""
        return ChunkStats(
            rows=self.rows,
            errors=self.errors,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            seconds=round(self.finished_at - self.started_at, 3),
            worker=self.worker,
            accelerator=self.accelerator,
        )


class ChunkStats(KeyRecord):
    """A finished chunk's numbers, in its stats key (`stats/<finished ms>.<chunk>.<these>`)."""

    rows: int
    errors: int
    tokens_in: int
    tokens_out: int
    seconds: float
    worker: str
    accelerator: str | None = None


WorkerState = Literal["starting", "loading", "running", "idle", "stopping", "exited"]


class Heartbeat(Record):
    """A worker's progress, rewritten every few seconds; its summary also lives in the key name."""

    worker: str
    holder: str
    state: WorkerState
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0
    chunks_done: int = 0
    rows_done: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_per_s: float = 0.0
    rows_per_s: float = 0.0
    accelerator: str | None = None
    spot: bool | None = None
    cloud: str | None = None
    region: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: float
    updated_at: float
    exit_code: int | None = None
    #: Seconds earlier processes of this worker id were up (carried over from their heartbeats):
    #: with this process's own, what the worker's machines have been billed for.
    uptime_before_s: float = 0.0

    @property
    def uptime_s(self) -> float:
        return self.uptime_before_s + max(self.updated_at - self.started_at, 0.0)

    def summary(self) -> HeartbeatSummary:
        # The fields were validated when this heartbeat was made: no second validation.
        return HeartbeatSummary.model_construct(**{f: getattr(self, f) for f in HeartbeatSummary.model_fields})


class HeartbeatSummary(KeyRecord):
    """The part of a heartbeat packed into its key: one list request gives every worker's state."""

    holder: str
    state: WorkerState
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0
    chunks_done: int = 0
    rows_done: int = 0
    errors: int = 0
    tokens_per_s: float = 0.0
    rows_per_s: float = 0.0
    accelerator: str | None = None
    spot: bool | None = None
    cloud: str | None = None
    region: str | None = None
    started_at: float
    updated_at: float
    exit_code: int | None = None
    uptime_before_s: float = 0.0


def dumps(obj: Any) -> bytes:
    """Canonical JSON for objects that are not records (hash inputs, small indexes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

"""The records workers and the controller exchange through the store, and how they are (de)serialised."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Iterable, Iterator, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import OrchError


class Record(BaseModel):
    """Records tolerate unknown fields, so an older orch can read what a newer worker wrote."""

    model_config = ConfigDict(extra="ignore")

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()


R = TypeVar("R", bound=Record)


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

    def stats_summary(self) -> dict[str, Any]:
        """What `status` reads from the stats listing instead of this marker's body."""
        return {
            "rows": self.rows,
            "errors": self.errors,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "seconds": round(self.finished_at - self.started_at, 3),
            "finished_at": round(self.finished_at, 3),
            "worker": self.worker,
            "accelerator": self.accelerator,
        }


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

    #: Fields packed into the key, so that one list request gives `status` every worker's state.
    SUMMARY_FIELDS: ClassVar[tuple[str, ...]] = (
        "holder", "state", "chunk", "chunk_rows", "chunk_rows_done", "chunks_done", "rows_done",
        "errors", "tokens_per_s", "rows_per_s", "accelerator", "spot", "cloud", "region", "started_at",
        "updated_at", "exit_code",
    )  # fmt: skip

    def summary(self) -> dict[str, Any]:
        data = self.model_dump(include=set(self.SUMMARY_FIELDS))
        data["tokens_per_s"] = round(data["tokens_per_s"], 1)
        data["rows_per_s"] = round(data["rows_per_s"], 4)
        data["started_at"] = round(data["started_at"], 3)
        data["updated_at"] = round(data["updated_at"], 3)
        return data


def dumps(obj: Any) -> bytes:
    """Canonical JSON for objects that are not records (hash inputs, small indexes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

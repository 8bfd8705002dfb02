"""The documents of `orch serve`: files, batches, idempotency keys."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.core.layout import ServeLayout
from orchestrator.core.records.base import (
    Document,
    Record,
    read_record,
)
from orchestrator.core.store import Store

FilePurpose = Literal["batch", "batch_output"]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
#: States a batch never leaves.
FINAL_BATCH_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})


class StoredFile(Record):
    """files/<id>.json: an uploaded file (purpose `batch`) or a batch's output or error file
    (`batch_output`), written once; its bytes are at files/<id>.content."""

    id: str
    owner: str = Field(description="the hash of the API key that owns it (serve/auth.py: owner_of), never the key")
    filename: str
    purpose: FilePurpose
    bytes: int
    created_at: int = Field(description="seconds since the epoch, as OpenAI gives it")
    created_ms: int = Field(description="the same, in milliseconds: the owner's index key (ServeLayout.owned)")


class BatchRequestError(Record):
    """One problem found while validating a batch's input file, as OpenAI lists them in `errors.data`."""

    code: str
    message: str
    line: int | None = Field(None, description="1-based line of the input file")
    param: str | None = None


class BatchCounts(Record):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchTokens(Record):
    input_tokens: int = 0
    output_tokens: int = 0
    #: Input tokens the engines' prefix caches held (OpenAI's `input_tokens_details.cached_tokens`).
    cached_tokens: int = 0


class BatchDocument(Document):
    """batches/<id>.json: an OpenAI batch object, its owner, and where the server is in its lifecycle.

    The run named by the batch id holds the work (prepared, planned and launched at validation).
    Updated only through `cas_update`, by the API (create, cancel) and the server's driver (the rest).
    """

    id: str
    owner: str = Field(description="the hash of the API key that created it, never the key")
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None = None
    model: str | None = Field(None, description="the served model's name, known once validation read the file")
    status: BatchStatus = "validating"
    created_at: int
    created_ms: int = Field(description="creation in milliseconds: the owner's index key (ServeLayout.owned)")
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    #: An end decided while the status still reads in_progress (expiry, workers out of relaunches):
    #: the driver stops the workers and writes the files, then sets the status. Cancels and
    #: completions have their own statuses (cancelling, finalizing) for the same step.
    ending: Literal["expired", "failed"] | None = None
    ending_at: int | None = None
    errors: list[BatchRequestError] = Field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    request_counts: BatchCounts = Field(default_factory=BatchCounts)
    usage: BatchTokens = Field(default_factory=BatchTokens)

    @property
    def final(self) -> bool:
        return self.status in FINAL_BATCH_STATUSES


class IdempotencyRecord(Document):
    """idempotency/<owner>/<key hash>.json: a POST /v1/batches sent with an Idempotency-Key, and its batch.

    Created (if absent) before the batch it names, so a retry of the request, even one racing the
    first, finds it: with the same request it answers with that batch (creating it with this id
    and time when the first request died before it could), with another it is refused.
    Never changed once written.
    """

    owner: str = Field(description="the hash of the API key that sent it, never the key")
    request: str = Field(description="SHA-256 of the request's fields: the key resent with others is refused")
    batch_id: str
    created_ms: int = Field(description="the batch's creation time, so that whoever creates it writes the same batch")


def read_batch(store: Store, layout: ServeLayout, batch_id: str) -> BatchDocument | None:
    found = read_record(store, layout.batch(batch_id), BatchDocument)
    return found[0] if found is not None else None


def read_file_record(store: Store, layout: ServeLayout, file_id: str) -> StoredFile | None:
    found = read_record(store, layout.file(file_id), StoredFile)
    return found[0] if found is not None else None

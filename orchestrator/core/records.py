"""Every document a run keeps in the store, typed, and the one way to read and update them.

A run is a prefix of the store (`runs/<run>/`, key names in core/protocol/layout.py). What lives
there, by who writes it:

    prepare, plan        spec.yaml              SpecDocument (YAML): the frozen spec and its hash
                         manifest.jsonl         ManifestEntry, one line per chunk
                         prepare.json           PrepareRecord: what was prepared from what
                         prepare-errors.jsonl   PrepareError, one line per input row set aside
                         plan.json              PlanRecord (and workers/<i>.txt: chunk paths, plain text)
    controller           jobs.json              JobsRecord: backend jobs per worker, every launch
                         cancel.json            CancelRecord: `orch cancel` was run; workers stop
                         adapters/<name>.json   AdapterManifest: a LoRA adapter shipped with the run
                         adapters/<name>/<file> its files (core/protocol/adapters.py)
                         decisions/<ms>.json    DecisionRecord: the deadline policy's log
    workers              leases/<chunk>.json    Lease
                         outputs/<chunk>/<part> OpenAI Batch output lines (core/lines.py)
                         done/<chunk>.json      DoneMarker: the authoritative list of a chunk's parts
                         stats/<ms>.<chunk>.<…> ChunkStats, in the key name (listings only)
                         heartbeats/<w>/<…>     Heartbeat body, HeartbeatSummary in the key name

`orch serve` keeps its own objects under `serve/` (layout.ServeLayout); each batch is also a run:

    orch serve           files/<id>.json        StoredFile: an OpenAI file object and its owner
                         files/<id>.content     the file's bytes
                         batches/<id>.json      BatchDocument: an OpenAI batch object and its owner
                         active/<id>            (empty) a batch the server still drives
                         idempotency/<o>/<hash> IdempotencyRecord: the batch an Idempotency-Key made
                         owners/<o>/<kind>/<…>  (empty) an owner's files and batches, newest first

`read_record` is the one reader (a document that does not parse is a CorruptRecord naming its
key, never a traceback), and `cas_update` the one read-change-write loop (create-if-absent, then
compare-and-swap on the ETag, re-read and re-applied when another writer came first).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import CorruptRecord, RunNotFound, StoreContention
from orchestrator.core.protocol.layout import RunLayout, ServeLayout, decode_key_record
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
        new = new.model_copy(update={"write_id": uuid.uuid4().hex})
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


# -- written by prepare and plan ----------------------------------------------------------------
class SpecDocument(Document):
    """spec.yaml: the run's spec as first frozen, and a hash of the fields that decide its outputs."""

    spec_hash: str = Field(description="core.spec.spec_hash of `spec`: workers stamp it on their markers")
    spec: dict[str, Any] = Field(description="the RunSpec, as a plain mapping")

    def to_bytes(self) -> bytes:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SpecDocument:
        return cls.model_validate(yaml.safe_load(data) or {})


class ManifestEntry(Record):
    """One chunk of canonical requests (a line of manifest.jsonl)."""

    chunk: str = Field(description="chunk id, e.g. part_00042")
    key: str = Field(description="path of the chunk file relative to the run")
    rows: int
    bytes: int
    est_prompt_tokens: int = Field(description="prompt tokens estimated from characters")
    max_output_tokens: int = Field(description="sum over rows of max_tokens x n: an upper bound")
    first: int | None = Field(
        None, description="position in the whole input of the chunk's first row (rows set aside counted)"
    )

    @property
    def est_tokens(self) -> int:
        """The work estimate the planner balances: prompt tokens plus the output budget."""
        return self.est_prompt_tokens + self.max_output_tokens


class PrepareRecord(Record):
    """prepare.json, written last by `orch prepare`: its presence means the run is prepared."""

    identity: dict[str, Any] = Field(
        description="what was prepared: the sources (name, size, content digest), input mapping and chunking"
    )
    chunks: int
    rows: int = Field(description="requests in the chunks")
    errors: int = Field(description="input rows set aside (prepare-errors.jsonl)")
    errors_key: str | None = None
    first_errors: list[str] = Field(default_factory=list, description="the first few, `file:line: problem`")
    created_at: float = 0.0
    models: dict[str, int] = Field(
        default_factory=dict, description="models the input lines named themselves, with how many lines named each"
    )
    not_utf8_rows: int = Field(0, description="rows kept with bytes that are not UTF-8 read as U+FFFD")
    not_utf8_bytes: int = 0
    first_not_utf8: list[str] = Field(default_factory=list, description="the first few such rows, `file:line`")


class PrepareError(Record):
    """A line of prepare-errors.jsonl: one input row set aside, and why."""

    source: str = Field(description="the input file, as given")
    line: int | None = Field(None, description="1-based line of a JSONL file")
    row: int | None = Field(None, description="0-based row of a Parquet file")
    error: str
    excerpt: str = Field("", description="the start of the row as read")
    position: int | None = Field(None, description="0-based position in the whole input: where collect answers it")
    custom_id: str | None = Field(None, description="the row's custom_id, when it has one")
    text: str | None = Field(None, description="the whole row as read: what a retry file gets")

    @property
    def location(self) -> str:
        """`file:line` (JSONL) or `file:row` (Parquet), as prepare reported it."""
        return f"{self.source}:{self.line if self.line is not None else self.row}"


class WorkerAssignment(Record):
    worker: int
    chunks: list[str]
    rows: int
    est_tokens: int


class PlanRecord(Record):
    """plan.json: every chunk on exactly one worker's list."""

    workers: list[WorkerAssignment]
    chunks: int
    rows: int
    est_tokens: int
    created_at: float


# -- written by the controller ------------------------------------------------------------------
class JobAttempt(Record):
    """One backend job that ran (or runs) a worker.

    A launch is first recorded `pending` (its job_id a token of the controller that reserved it),
    by compare-and-swap, then submitted, then its real job id recorded: two controllers that want
    the same worker cannot both get past the first step.
    """

    job_id: str
    backend: str
    launched_at: float
    reason: str = Field("launch", description="launch | relaunch after <state> | resume | deadline ...")
    use_spot: bool | None = None
    #: Filled when the controller sees the job end.
    ended_state: str | None = None
    ended_at: float | None = None
    failure_reason: str | None = None
    #: Cancelled by the deadline policy (ahead of schedule): never relaunched.
    retired: bool = False
    #: Reserved, not submitted yet (or never: a submission that failed has ended_state FAILED).
    pending: bool = False


class WorkerJobs(Record):
    worker: int
    attempts: list[JobAttempt] = Field(default_factory=list)
    #: Relaunches counted against the retry budget.
    relaunches: int = 0

    @property
    def current(self) -> JobAttempt | None:
        return self.attempts[-1] if self.attempts else None


class JobsRecord(Document):
    """jobs.json: which backend job runs each worker now, and every launch before it. Updated only
    through `update_jobs` (compare-and-swap), so two controllers never lose each other's launches."""

    backend: str | None = None
    workers: dict[str, WorkerJobs] = Field(default_factory=dict)
    #: Set by `orch cancel`: a CANCELLED job is then ours, not a reason to relaunch.
    cancelled: bool = False

    def worker(self, worker: int) -> WorkerJobs:
        return self.workers.setdefault(str(worker), WorkerJobs(worker=worker))

    def current_jobs(self) -> dict[int, JobAttempt]:
        return {w.worker: w.current for w in self.workers.values() if w.current is not None}


def read_jobs(store: Store, layout: RunLayout) -> tuple[JobsRecord, str | None]:
    """The jobs record (empty for a run never launched) and its ETag."""
    found = read_record(store, layout.jobs, JobsRecord)
    return found if found is not None else (JobsRecord(), None)


def update_jobs(store: Store, layout: RunLayout, change: Callable[[JobsRecord], None]) -> JobsRecord:
    """Change the jobs record in place through `change`, written back by compare-and-swap."""

    def apply(record: JobsRecord | None) -> JobsRecord:
        record = record or JobsRecord()
        change(record)
        return record

    record, _ = cas_update(store, layout.jobs, JobsRecord, apply)
    assert record is not None  # apply always returns a record
    return record


class CancelRecord(Record):
    """cancel.json, written by `orch cancel` and removed by the next launch: every worker that
    sees it (at its next heartbeat) flushes, gives its leases back and stops, tracked or not."""

    at: float
    by: str = Field("", description="host and pid of the `orch cancel` that wrote it")


class AdapterFile(Record):
    path: str = Field(description="relative to the adapter's directory, '/'-separated")
    bytes: int
    sha256: str


class AdapterManifest(Record):
    """adapters/<name>.json: a LoRA adapter copied from the launching machine into the run, written
    after its files, so workers anywhere load exactly these bytes."""

    name: str
    source: str = Field(description="the directory it was copied from (spec model.lora)")
    files: list[AdapterFile]


class DecisionRecord(Record):
    """decisions/<ms>.json: one decision of the deadline policy (`orch watch --deadline`), with its numbers."""

    at: float
    deadline_s: float
    budget_usd: float | None = None
    action: Literal["hold", "launch", "retire", "budget"]
    mode: Literal["complete", "critical", "behind", "on-line", "ahead"]
    reason: str
    launch: int = 0
    retire: list[int] = Field(default_factory=list)
    elapsed_s: float = 0.0
    progress: float = Field(0.0, description="fraction of rows done")
    line: float = Field(0.0, description="fraction the uniform line asks for at `at`")
    need_rows_per_s: float = 0.0
    have_rows_per_s: float = 0.0
    slack_s: float | None = None


# -- written by workers -------------------------------------------------------------------------
class Lease(Document):
    """Who works on a chunk, until when. `holder` is unique to one worker process."""

    chunk: str
    worker: str
    holder: str
    acquired_at: float
    renewed_at: float
    expires_at: float
    released: bool = False
    #: Holders that died holding this chunk; from 1 on, holders work carefully (core/protocol/crashes.py).
    crashes: int = 0
    #: A careful holder's note: the rows it handed to the engine and that have not finished yet.
    in_flight: list[int] | None = None
    #: Rows in flight when a careful holder died: each runs alone from then on.
    suspects: list[int] = Field(default_factory=list)
    #: Rows in flight during two deaths: answered with a `worker_crashed` error row, never run again.
    poison: list[int] = Field(default_factory=list)

    def is_free(self, now: float) -> bool:
        return self.released or self.expires_at <= now


class PartRef(Record):
    """One checkpointed output object, as a done marker lists it."""

    key: str
    rows: int
    errors: int
    bytes: int
    sha256: str
    #: The store's ETag when it was written: listings then show a changed part without reading it.
    etag: str | None = None


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
    #: Seconds earlier processes of this worker id were up (carried over from their heartbeats):
    #: with this process's own, what the worker's machines have been billed for.
    uptime_before_s: float = 0.0
    #: A process of this worker id loaded the model (carried over like the uptime): from then on
    #: the run's model may have produced outputs, so it stays frozen (core/context.py).
    loaded: bool = False

    @property
    def uptime_s(self) -> float:
        return self.uptime_before_s + max(self.updated_at - self.started_at, 0.0)


class Heartbeat(HeartbeatSummary):
    """A worker's progress, rewritten every few seconds: its summary, which also lives in the key
    name, and what only the document holds."""

    worker: str
    tokens_in: int = 0
    tokens_out: int = 0
    host: str | None = None
    pid: int | None = None

    def key_values(self) -> list[Any]:
        # The key holds the summary's fields only: the fields added here live in the document.
        return self.summary().key_values()

    def summary(self) -> HeartbeatSummary:
        # The fields were validated when this heartbeat was made: no second validation.
        return HeartbeatSummary.model_construct(**{f: getattr(self, f) for f in HeartbeatSummary.model_fields})


# -- reading a run's documents ------------------------------------------------------------------
def read_manifest(store: Store, layout: RunLayout) -> list[ManifestEntry]:
    """The run's chunks; RunNotFound when it was never prepared."""
    try:
        return read_jsonl(ManifestEntry, store.get(layout.manifest).data, layout.manifest)
    except NotFound:
        if not any(True for _ in store.list("runs/")):
            raise RunNotFound(
                f"the store {store.uri} holds no runs at all (so no run {layout.run!r})",
                hint="check --store (or ORCH_STORE, or `store:` in orch.yaml); "
                f"or prepare the run first: orch prepare DATA --run {layout.run} --num-chunks N",
            ) from None
        raise RunNotFound(
            f"run {layout.run!r} has no manifest in {store.uri}",
            hint=f"prepare it first: orch prepare DATA --run {layout.run} --num-chunks N",
        ) from None


def read_plan(store: Store, layout: RunLayout) -> PlanRecord | None:
    found = read_record(store, layout.plan, PlanRecord)
    return found[0] if found is not None else None


def read_marker(store: Store, layout: RunLayout, chunk: str) -> DoneMarker | None:
    """The chunk's done marker, or None while the chunk is not done."""
    found = read_record(store, layout.done(chunk), DoneMarker)
    return found[0] if found is not None else None


# -- written by `orch serve` --------------------------------------------------------------------
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

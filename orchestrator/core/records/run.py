"""The documents of a run: written by prepare and plan, the controller, and the workers."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Literal

import yaml
from pydantic import Field

from orchestrator.core.errors import RunNotFound
from orchestrator.core.layout import RunLayout
from orchestrator.core.records.base import (
    Document,
    KeyRecord,
    Record,
    cas_update,
    read_jsonl,
    read_record,
)
from orchestrator.core.store import NotFound, Store


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
    positions: str | None = Field(
        None,
        description="grouped by prefix: path (relative to the run) of the file giving each row's input position",
    )
    positions_sha256: str | None = Field(
        None,
        description="grouped by prefix: SHA-256 of the positions file as written, checked at collect "
        "(None in runs prepared before it was recorded: collect then checks only that positions are a permutation)",
    )
    prefix_groups: int | None = Field(None, description="grouped by prefix: distinct prompt prefixes in the chunk")
    est_shared_tokens: int = Field(
        0, description="grouped by prefix: prompt tokens estimated shared with the row before"
    )
    edge_prefixes: list[str] = Field(
        default_factory=list,
        description="grouped by prefix: hashes of the chunk's first and last prefix groups, "
        "the only ones it can share with other chunks",
    )
    model: str | None = Field(
        None, description="a run of several models: the served name of the model whose rows the chunk holds"
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
    key_digest: str | None = Field(
        None,
        description="the answer keys' context digest (hex, prepare/answers/answer_keys.py): collect keys the chunks' "
        "lines with it (None: prepared before answer keys; such a run cannot be reused from)",
    )
    key_digests: dict[str, str] = Field(
        default_factory=dict,
        description='a run of several models or a sweep: each model pool\'s key digest (`models:` name; "" for '
        "the run's one model), as collect keys each chunk's lines by its model; key_digest is then None",
    )
    key_adapters: dict[str, list[str]] = Field(
        default_factory=dict,
        description="each model pool's LoRA adapter names (\"\" for the run's one model): a line whose body.model "
        "names one keeps that name in its key, since it picks the adapter's weights",
    )
    reused: int = Field(0, description="input rows answered from earlier runs (reuse.json), in no chunk")
    sampled_from: int | None = Field(
        None, description="a pilot (input.limit): the input's rows its stratified sample was drawn from"
    )


class PrepareError(Record):
    """A line of prepare-errors.jsonl: one input row set aside, and why."""

    source: str = Field(description="the input file, as given")
    line: int | None = Field(None, description="1-based line of a JSONL file")
    row: int | None = Field(None, description="0-based row of a Parquet file")
    error: str
    code: str | None = Field(None, description="the error line's code (None: invalid_request)")
    excerpt: str = Field("", description="the start of the row as read")
    position: int | None = Field(None, description="0-based position in the whole input: where collect answers it")
    custom_id: str | None = Field(None, description="the row's custom_id, when it has one")
    text: str | None = Field(None, description="the whole row as read: what a retry file gets")
    line_bytes: int | None = Field(
        None, description="a line over input.max_line_bytes: its size; never read whole, it has no `text`"
    )

    @property
    def location(self) -> str:
        """`file:line` (JSONL) or `file:row` (Parquet), as prepare reported it."""
        return f"{self.source}:{self.line if self.line is not None else self.row}"


class WorkerAssignment(Record):
    worker: int
    chunks: list[str]
    rows: int
    est_tokens: int
    model: str | None = Field(None, description="a run of several models: the model this worker loads (its pool)")


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
    #: The controller that reserved it (`host:pid:start ticks`, core.processes): on that machine,
    #: a reservation whose controller has died (a SIGKILL between reserving and recording) ends at once.
    reserved_by: str | None = None
    #: A run of several models, a worker outside the plan (the deadline policy's on-demand ones):
    #: the pool (model) it was launched for, so that a relaunch loads the same one.
    pool: str | None = None


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
    #: When the run was cancelled, while it is (the next launch moves it into `pauses`).
    cancelled_at: float | None = None
    #: [cancelled at, launched again at] of every earlier cancel: time the run sat stopped, which
    #: its run time leaves out (runview/pace.py).
    pauses: list[tuple[float, float]] = Field(default_factory=list)

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
    by: str = Field("", description="the `orch cancel` that wrote it: host:pid:start ticks (core.processes)")


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
    mode: Literal["complete", "critical", "behind", "waiting", "on-line", "ahead"]
    reason: str
    launch: int = 0
    retire: list[int] = Field(default_factory=list)
    elapsed_s: float = 0.0
    progress: float = Field(0.0, description="fraction of rows done")
    line: float = Field(0.0, description="fraction the uniform line asks for at `at`")
    need_rows_per_s: float = 0.0
    have_rows_per_s: float = 0.0
    slack_s: float | None = None
    speed: str = Field("", description="which speed a new worker was reckoned at: measured, or the table's")
    zone: str = Field("", description="with resources.zones: the zone order launches tried, and why the first")
    pool: str | None = Field(None, description="a run of several models: the pool (model) this decision is for")


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
    #: The holder's engine failed under it (LeaseKeeper.release(died=True)): free at once, as a death.
    gave_up: bool = False
    #: Holders that died holding this chunk; from 1 on, holders work carefully (core/protocol/crashes.py).
    crashes: int = 0
    #: A careful holder's note: the rows it handed to the engine and that have not finished yet.
    in_flight: list[int] | None = None
    #: When the note was written, by the holder's clock (as `renewed_at`, which a renewal after
    #: crashes.QUICK_DEATH_S moves on: the rows then outlived a quick death).
    noted_at: float | None = None
    #: Rows in flight when a careful holder died: each runs alone from then on.
    suspects: list[int] = Field(default_factory=list)
    #: The evidence against rows: row -> the holders that died within crashes.QUICK_DEATH_S of
    #: starting it alone in their engine.
    lone_deaths: dict[int, list[str]] = Field(default_factory=dict)
    #: Rows with evidence from two deaths: answered with a `worker_crashed` error row, never run again.
    poison: list[int] = Field(default_factory=list)

    def is_free(self, now: float) -> bool:
        """Released, given up, or expired by the clock of `now` (leases.acquire also asks the store's)."""
        return self.released or self.gave_up or self.expires_at <= now


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
    #: Prompt tokens the engine's prefix cache held (part of tokens_in); 0 from an older worker.
    tokens_cached: int = 0

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
            tokens_cached=self.tokens_cached,
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
    #: Prompt tokens the prefix cache held (part of tokens_in); 0 in a key written before it was counted.
    tokens_cached: int = 0


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
    #: This process's clock minus the store's, measured at its last heartbeat (core/protocol/clocks.py).
    clock_offset_s: float | None = None
    #: Rows of the chunks in hand already checkpointed (resumed ones included): kept if it dies.
    rows_saved: int = 0
    #: Rows of the chunks in hand answered and held in memory until the next checkpoint: what
    #: `status` shows as answered, not yet saved (lost if the process dies before its flush).
    rows_unsaved: int = 0

    @property
    def uptime_s(self) -> float:
        return self.uptime_before_s + max(self.updated_at - self.started_at, 0.0)


class Heartbeat(HeartbeatSummary):
    """A worker's progress, rewritten every few seconds: its summary, which also lives in the key
    name, and what only the document holds."""

    worker: str
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    #: Engine seconds (pumps under way included) and model-load seconds of this process: what a
    #: probe measures its rates over, and the run's actual engine time (planning/forecast.py).
    busy_s: float = 0.0
    load_s: float = 0.0
    #: CPU seconds of this process in the engine's pumps so far (those that ended).
    busy_cpu_s: float = 0.0
    #: When the first engine batch of rows was done: [busy_s, busy_cpu_s, rows, tokens_in,
    #: tokens_out, tokens_cached] (worker/totals.py); None before that.
    first_batch: list[float] | None = None
    host: str | None = None
    pid: int | None = None

    def key_values(self) -> list[Any]:
        # The key holds the summary's fields only: the fields added here live in the document.
        return [getattr(self, name) for name in HeartbeatSummary.model_fields]

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
        others = [name for name in run_names(store) if name != layout.run]  # itself: begun, never prepared
        close = difflib.get_close_matches(layout.run, others, n=1)
        raise RunNotFound(
            f"run {layout.run!r} has no manifest in {store.uri}",
            hint=f"did you mean --run {close[0]}?"
            if close
            else f"prepare it first: orch prepare DATA --run {layout.run} --num-chunks N",
        ) from None


#: Where every run's keys start.
RUNS_PREFIX = "runs/"


def run_names(store: Store) -> list[str]:
    """Every run in the store, in name order, with one listing request per run: each asks for the
    keys after the previous run's (`runs/<name>0` sorts after every `runs/<name>/...` key and
    before the next run's), and stops at the first."""
    names: list[str] = []
    after: str | None = None
    while True:
        first = next(iter(store.list(RUNS_PREFIX, start_after=after)), None)
        if first is None:
            return names
        name = first.key[len(RUNS_PREFIX) :].partition("/")[0]
        names.append(name)
        after = f"{RUNS_PREFIX}{name}0"  # "0" follows "/": past every key of this run


def read_plan(store: Store, layout: RunLayout) -> PlanRecord | None:
    found = read_record(store, layout.plan, PlanRecord)
    return found[0] if found is not None else None


def read_marker(store: Store, layout: RunLayout, chunk: str) -> DoneMarker | None:
    """The chunk's done marker, or None while the chunk is not done."""
    found = read_record(store, layout.done(chunk), DoneMarker)
    return found[0] if found is not None else None

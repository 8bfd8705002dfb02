"""The jobs record: which backend job runs each worker now, and every launch before it.

It lives in the store (`jobs.json`) so that a controller restarted anywhere knows what it
launched; it is updated by compare-and-swap, so two controllers cannot lose each other's launches.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from orchestrator.errors import BackendError
from orchestrator.protocol.layout import RunLayout
from orchestrator.protocol.records import Record, parse_record
from orchestrator.store import NotFound, PreconditionFailed, Store


class JobAttempt(Record):
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


class WorkerJobs(Record):
    worker: int
    attempts: list[JobAttempt] = Field(default_factory=list)
    #: Relaunches counted against the retry budget.
    relaunches: int = 0

    @property
    def current(self) -> JobAttempt | None:
        return self.attempts[-1] if self.attempts else None


class JobsRecord(Record):
    backend: str | None = None
    workers: dict[str, WorkerJobs] = Field(default_factory=dict)
    #: Set by `orch cancel`: a CANCELLED job is then ours, not a reason to relaunch.
    cancelled: bool = False

    def worker(self, worker: int) -> WorkerJobs:
        return self.workers.setdefault(str(worker), WorkerJobs(worker=worker))

    def current_jobs(self) -> dict[int, JobAttempt]:
        return {w.worker: w.current for w in self.workers.values() if w.current is not None}


def read_jobs(store: Store, layout: RunLayout) -> tuple[JobsRecord, str | None]:
    try:
        blob = store.get(layout.jobs)
    except NotFound:
        return JobsRecord(), None
    return parse_record(JobsRecord, blob.data, layout.jobs), blob.etag


def update_jobs(store: Store, layout: RunLayout, change: Callable[[JobsRecord], None]) -> JobsRecord:
    """Read, change, write back with compare-and-swap; retried when another controller wrote first."""
    for _ in range(20):
        record, etag = read_jobs(store, layout)
        change(record)
        try:
            if etag is None:
                store.put_if_absent(layout.jobs, record.to_bytes())
            else:
                store.compare_and_swap(layout.jobs, record.to_bytes(), etag)
            return record
        except PreconditionFailed:
            continue
    raise BackendError(f"{layout.jobs} kept changing under us", hint="is another `orch watch` running? try again")

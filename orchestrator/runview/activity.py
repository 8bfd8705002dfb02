"""What a worker does and what a run is (runview/states.py's words), derived through two tables: a
worker's from its heartbeat while it beats, else from its job's state; the run's from its chunks and
its workers'. One derivation for `orch status`, `watch`, `run`, `runs`, the page and `/metrics`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from orchestrator.backends.base import JobState, JobStatus
from orchestrator.core.records import HeartbeatSummary, JobAttempt
from orchestrator.runview.states import GOING, Recovery, RunState, WorkerActivity

A = WorkerActivity

#: A heartbeat silent this many intervals reads `silent` (within the liveness window: it may come back).
SILENT_AFTER_BEATS = 2

#: What a worker does while its heartbeat beats, by the heartbeat's state; `running` and `idle`
#: read by whether it holds a chunk.
BY_HEARTBEAT: Mapping[str, WorkerActivity] = {
    "starting": A.STARTING,
    "loading": A.LOADING,
    "stopping": A.DRAINING,
}

#: What a worker does when no live heartbeat says, by its job's state. A RUNNING job whose worker
#: has not beaten yet is starting; UNKNOWN reads from the last heartbeat (`exited`, `gone`).
BY_JOB_STATE: Mapping[JobState, WorkerActivity] = {
    JobState.PENDING: A.QUEUED,
    JobState.STARTING: A.PROVISIONING,
    JobState.RUNNING: A.STARTING,
    JobState.RECOVERING: A.RECOVERING,
    JobState.WINDING_DOWN: A.EXITED,
    JobState.CANCELLING: A.DRAINING,
    JobState.SUCCEEDED: A.FINISHED,
    JobState.CANCELLED: A.CANCELLED,
    JobState.FAILED: A.FAILED,
    JobState.FAILED_SETUP: A.FAILED,
    JobState.FAILED_PRECHECKS: A.FAILED,
    JobState.FAILED_NO_RESOURCE: A.FAILED,
    JobState.FAILED_CONTROLLER: A.FAILED,
}


def run_state(
    *, complete: bool, damaged: bool, cancelled: bool, activities: Iterable[WorkerActivity], launched: bool
) -> RunState:
    """The run in a word: its chunks first (complete, damaged), then `orch cancel`, then its workers."""
    if complete:
        return RunState.COMPLETE
    if damaged:
        return RunState.DAMAGED
    if cancelled:
        return RunState.CANCELLED
    if any(a in GOING for a in activities):
        return RunState.RUNNING
    return RunState.STOPPED if launched else RunState.PREPARED


def shown_status(status: JobStatus | None, hb: HeartbeatSummary | None, *, complete: bool) -> JobStatus | None:
    """The job's state as status shows it, the worker's own last word taken over the backend's:
    a process that published its exit 0 has finished (SUCCEEDED) while its machine or shell still
    winds down; under a complete run a job still running winds down (WINDING_DOWN), never RUNNING."""
    if status is None or status.state not in (JobState.RUNNING, JobState.WINDING_DOWN):
        return status
    this_job = hb is not None and (status.started_at is None or hb.updated_at >= status.started_at)
    if this_job and hb is not None and hb.state == "exited" and hb.exit_code == 0:
        return replace(status, state=JobState.SUCCEEDED)
    if complete and status.state is JobState.RUNNING:
        return replace(status, state=JobState.WINDING_DOWN)
    return status


def worker_activity(
    hb: HeartbeatSummary | None,
    live: HeartbeatSummary | None,
    status: JobStatus | None,
    attempt: JobAttempt | None,
    *,
    now: float,
    interval: float,
    cancelled: bool,
) -> tuple[WorkerActivity, float | None]:
    """The worker's activity and, where known, for how long (`live`: its heartbeat while it beats)."""
    if live is not None:
        silent = now - live.updated_at
        if silent > SILENT_AFTER_BEATS * interval:
            return A.SILENT, round(silent, 1)
        activity = A.DRAINING if cancelled else BY_HEARTBEAT.get(live.state)
        if activity is None:
            return (A.WORKING if live.chunk else A.BETWEEN_CHUNKS), None
        timed = activity in (A.LOADING, A.STARTING)
        return activity, round(max(now - live.started_at, 0.0), 1) if timed else None
    state = status.state if status is not None else JobState.UNKNOWN
    if state is JobState.UNKNOWN:
        if hb is not None:
            return (A.EXITED if hb.state == "exited" else A.GONE), None
        return (A.LAUNCHED if attempt is not None else A.NOT_LAUNCHED), None
    if state is JobState.RUNNING and hb is not None and hb.state == "exited":
        return A.EXITED, None
    return BY_JOB_STATE[state], None


def recovery_of(
    status: JobStatus | None, hb: HeartbeatSummary | None, *, now: float, interval: float
) -> Recovery | None:
    """What the evidence says of the job's recovery by the backend (None: no recovery, or no evidence):

    1. The job is RECOVERING and its worker still beats (within two intervals, not exited): the
       backend's check of the machine failed, not the machine (SPURIOUS).
    2. The job was recovered and the process that beats now started before the job's current
       machine did (`running_since`): it outlived the recovery (SPURIOUS).
    3. The job is RECOVERING and its worker's last heartbeat is old and says it neither drained nor
       exited: the machine went away under it (LOST). A worker that drained first (a preemption
       notice, or the recovery's own teardown) is evidence of neither.
    """
    if status is None or hb is None:
        return None
    fresh = hb.state != "exited" and now - hb.updated_at <= SILENT_AFTER_BEATS * interval
    if status.state is JobState.RECOVERING:
        if fresh:
            return Recovery.SPURIOUS
        return Recovery.LOST if hb.state not in ("stopping", "exited") else None
    since = status.running_since
    if status.recovery_count and since is not None and fresh and hb.started_at < since <= hb.updated_at:
        return Recovery.SPURIOUS
    return None

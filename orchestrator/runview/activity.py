"""What a worker does and what a run is, in words: one derivation for `orch status`, `watch`, `run`,
`runs` and the page, from a worker's heartbeat while it beats, else from its job's state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from orchestrator.backends.base import JobState, JobStatus
from orchestrator.core.records import HeartbeatSummary, JobAttempt

#: The words `activity` takes, each with what it means (status, watch, run and the page show them).
WORKER_ACTIVITIES = {
    "not launched": "planned, no job yet",
    "queued": "its job waits for the scheduler or for capacity",
    "provisioning": "its machine is being started and set up",
    "recovering": "its machine was lost; the backend starts another",
    "starting": "the worker program started and looks for work (or waits on an older twin)",
    "loading": "the worker loads the model into its engine",
    "working": "the worker answers a chunk's rows",
    "between chunks": "the worker finished a chunk and looks for the next one",
    "draining": "cancelled or stopping: it flushes its finished rows and gives its leases back",
    "silent": "no heartbeat for more than two intervals: the store may be out of its reach, or it hangs",
    "exited": "the worker program ended",
    "finished": "its job ended with the worker's success",
    "failed": "its job failed (see the reason below the table)",
    "cancelled": "its job was cancelled",
    "launched": "a job was submitted; the backend says nothing more (or was not asked)",
    "gone": "its last heartbeat is old and its job is not known: the process is gone",
}


#: The words RunStatus.state takes.
RUN_STATES = {
    "complete": "every chunk has a marker and nothing is damaged",
    "damaged": "every chunk has a marker, but some cannot be collected (`orch redo` them)",
    "cancelled": "`orch cancel` stopped it; `orch resume` goes on",
    "running": "a worker beats, or a job is queued, starting or recovering",
    "stopped": "workers were launched, none runs now, and chunks are left (`orch resume`)",
    "prepared": "prepared, no worker launched yet",
}

#: Worker activities that mean the run is going on.
_GOING = {
    "queued",
    "provisioning",
    "recovering",
    "starting",
    "loading",
    "working",
    "between chunks",
    "draining",
    "silent",
}


def run_state(*, complete: bool, damaged: bool, cancelled: bool, activities: Iterable[str], launched: bool) -> str:
    """The run in a word (RUN_STATES)."""
    if complete:
        return "complete"
    if damaged:
        return "damaged"
    if cancelled:
        return "cancelled"
    if any(a in _GOING for a in activities):
        return "running"
    return "stopped" if launched else "prepared"


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
) -> tuple[str, float | None]:
    """The worker's activity in words (WORKER_ACTIVITIES) and, where known, for how long."""
    if live is not None:
        silent = now - live.updated_at
        if silent > 2 * interval:
            return "silent", round(silent, 1)
        if cancelled or live.state == "stopping":
            return "draining", None
        if live.state == "loading":
            return "loading", round(max(now - live.started_at, 0.0), 1)
        if live.state == "starting":
            return "starting", round(max(now - live.started_at, 0.0), 1)
        return ("working" if live.chunk else "between chunks"), None
    state = status.state if status is not None else None
    if state is None or state is JobState.UNKNOWN:
        if hb is not None:
            return ("exited" if hb.state == "exited" else "gone"), None
        return ("launched" if attempt is not None else "not launched"), None
    if not state.is_terminal():
        words = {
            JobState.PENDING: "queued",
            JobState.STARTING: "provisioning",
            JobState.RECOVERING: "recovering",
            JobState.CANCELLING: "draining",
            JobState.WINDING_DOWN: "exited",
        }
        return words.get(state, "exited" if hb is not None and hb.state == "exited" else "starting"), None
    if state is JobState.SUCCEEDED:
        return "finished", None
    return ("cancelled" if state is JobState.CANCELLED else "failed"), None

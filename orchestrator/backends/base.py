"""What a backend is to the controller: launch workers, report their job states, cancel them."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.core.processes import gone
from orchestrator.core.records import Heartbeat, JobAttempt

#: A launch reserved this long ago and still not recorded: its controller died before submitting.
PENDING_TIMEOUT_S = 900.0


class JobState(str, enum.Enum):
    """A worker job's state, the same words for every backend (SkyPilot's managed-job states)."""

    PENDING = "PENDING"  # submitted, waiting for the scheduler or for capacity
    STARTING = "STARTING"  # provisioning the machine and running setup
    RUNNING = "RUNNING"  # the worker program runs
    RECOVERING = "RECOVERING"  # the machine was lost (spot preemption); the backend relaunches it
    WINDING_DOWN = "WINDING_DOWN"  # the run finished; the machine is being released
    CANCELLING = "CANCELLING"  # a cancel was requested and is under way
    SUCCEEDED = "SUCCEEDED"  # the worker exited 0 (it found no more work)
    CANCELLED = "CANCELLED"  # cancelled by a user or by `orch cancel`
    FAILED = "FAILED"  # the worker exited non-zero, or the process was killed
    FAILED_SETUP = "FAILED_SETUP"  # the setup commands failed
    FAILED_PRECHECKS = "FAILED_PRECHECKS"  # the task was refused before provisioning
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"  # no capacity for any of the candidates
    FAILED_CONTROLLER = "FAILED_CONTROLLER"  # the backend's own controller failed
    UNKNOWN = "UNKNOWN"  # the backend no longer knows the job (or cannot be asked right now)

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def is_live(self) -> bool:
        """Holds (or will soon hold) a machine: launching again would duplicate the worker."""
        return not self.is_terminal() and self is not JobState.UNKNOWN


_TERMINAL = {
    JobState.SUCCEEDED,
    JobState.CANCELLED,
    JobState.FAILED,
    JobState.FAILED_SETUP,
    JobState.FAILED_PRECHECKS,
    JobState.FAILED_NO_RESOURCE,
    JobState.FAILED_CONTROLLER,
}

#: How `orch status` colours each state.
STATE_COLOURS = {
    JobState.PENDING: "white",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.RECOVERING: "yellow",
    JobState.WINDING_DOWN: "cyan",
    JobState.CANCELLING: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.CANCELLED: "yellow",
    JobState.FAILED: "red",
    JobState.FAILED_SETUP: "red",
    JobState.FAILED_PRECHECKS: "red",
    JobState.FAILED_NO_RESOURCE: "red",
    JobState.FAILED_CONTROLLER: "red",
    JobState.UNKNOWN: "white",
}


@dataclass
class LaunchRequest:
    """One worker to start. `envs` are plain settings; `secrets` are never written anywhere."""

    worker: int
    name: str
    envs: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict)
    #: Only for the deadline policy: force spot (True) or on-demand (False); None = the spec's choice.
    use_spot: bool | None = None
    #: The spec's zones, best first (planning/zone_steering.py); empty: as the spec lists them.
    zones: list[str] = field(default_factory=list)
    #: A run of several models: the model the worker loads (its pool), whose resources it runs on.
    model: str | None = None
    #: A probe of one candidate accelerator: the GPU types it is pinned to; None: the spec's.
    gpus: list[str] | None = None


@dataclass
class JobStatus:
    """What the backend says about one job."""

    job_id: str
    state: JobState
    recovery_count: int = 0
    accelerator: str | None = None
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    spot: bool | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    #: Since when it runs in its current machine (its last recovery, else its start), where known.
    running_since: float | None = None
    #: The backend's record says RUNNING but nothing runs (orphaned): read as UNKNOWN by the controller.
    orphaned: bool = False
    #: Where the job's log is: a file (local), or the command that shows it (SkyPilot).
    log: str | None = None


class Launcher(Protocol):
    """A backend. Implementations take their side effects (SDK, process runner, clock) in the constructor."""

    name: str

    def launch(self, requests: Sequence[LaunchRequest]) -> dict[int, str]:
        """Submit every request concurrently; returns worker -> job id. Raises LaunchFailed naming
        the workers that could not be submitted (those that were are in its `.launched`)."""

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The current state of each job (UNKNOWN for ids the backend no longer knows)."""

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Stop the jobs; cancelling a finished job is not an error."""

    def find_strays(self, run: str, known: Sequence[str], beats: Sequence[Heartbeat]) -> dict[str, str]:
        """What works for the run outside the jobs in `known` (launches the jobs record lost), as
        far as this backend can find it; `beats` are the run's live heartbeats (host, pid).
        Returns a handle for `stop_strays` -> what it is, described for the user."""

    def stop_strays(self, handles: Sequence[str]) -> None:
        """Stop what `find_strays` found (what has ended since is no error)."""


#: A job the backend has called RUNNING this long, with no heartbeat from its worker for as long,
#: is a record its controller left behind: a lost machine reads RECOVERING within a minute.
ORPHAN_AFTER_S = 900.0


def orphaned(status: JobStatus, last_beat: float | None, *, now: float, after_s: float = ORPHAN_AFTER_S) -> bool:
    """The backend's record says RUNNING but nothing runs: SkyPilot's API server restarted under a
    managed job (its controller died with it), the record stays RUNNING and `sky jobs cancel` does
    not clear it. `last_beat`: when any process of the job's worker last beat (None: never)."""
    if status.state is not JobState.RUNNING:
        return False
    since = status.running_since or status.started_at
    if since is None or now - since < after_s:
        return False  # the set-up (no heartbeat yet) may still be installing
    return last_beat is None or now - last_beat >= after_s


def attempt_statuses(launcher: Launcher, attempts: Iterable[JobAttempt], now: float) -> dict[str, JobStatus]:
    """What the backend says of each attempt's job. Reservations (launches under way) are answered
    here: PENDING while fresh, FAILED once a submission failed or its controller vanished."""
    attempts = list(attempts)
    submitted = [a.job_id for a in attempts if not a.pending]
    out = launcher.statuses(submitted) if submitted else {}
    for a in attempts:
        if not a.pending:
            continue
        if a.ended_state is not None:
            out[a.job_id] = JobStatus(a.job_id, JobState(a.ended_state), failure_reason=a.failure_reason)
        elif a.reserved_by is not None and gone(a.reserved_by):
            pid = a.reserved_by.split(":")[1]
            why = f"its launch was never recorded: the controller that reserved it (pid {pid}) is gone"
            out[a.job_id] = JobStatus(a.job_id, JobState.FAILED, failure_reason=why)
        elif now - a.launched_at < PENDING_TIMEOUT_S:
            out[a.job_id] = JobStatus(a.job_id, JobState.PENDING, started_at=a.launched_at)
        else:
            out[a.job_id] = JobStatus(
                a.job_id, JobState.FAILED, failure_reason="its launch was never recorded: the controller stopped"
            )
    return out


@dataclass(frozen=True)
class Offering:
    """One machine type with a GPU, in one region of one cloud, as a cloud's catalog lists it: what a
    backend's catalog reader gives `orch prices --refresh` (controller.pricing) to build its table from."""

    gpu: str
    cloud: str
    region: str
    gpus: int  # per machine
    on_demand: float  # USD per machine-hour
    spot: float | None  # None where the catalog has no spot price

"""What a run is and what its workers do, in a word: the enums, their sets and colours, and the one table of moves.

Neither is stored: both are derived at each reading (runview/activity.py), the run's from its
chunks and its workers', a worker's from its heartbeat while it beats, else from its job's state.
So a move is what two readings in a row may show. MOVES lists every move a run or a worker makes,
with what makes it; two readings further apart may show any path through the table (`reachable`).

A run's life:

    prepared ─► running ─► complete                every chunk has its marker, none damaged
                 │  ▲  └─► damaged ─► running      a marker cannot be collected: `orch redo`
                 │  │
                 ▼  │ orch resume / relaunch
             stopped, cancelled

A worker's: not launched ─► launched / queued ─► provisioning ─► starting ─► loading ─► working
⇄ between chunks ─► draining ─► exited ─► finished (or failed, cancelled; silent and recovering
on the way; gone when its job is forgotten).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

W = TypeVar("W", bound="Words")


class Words(str, enum.Enum):
    """Words that each mean something: members are `NAME = "word", "what it means"`, compare equal
    to their word, and show as it (`str(RunState.RUNNING)` is `running`)."""

    _value_: str
    meaning: str

    def __new__(cls: type[W], word: str, meaning: str) -> W:
        member = str.__new__(cls, word)
        member._value_, member.meaning = word, meaning
        return member

    def __str__(self) -> str:
        return self._value_


class RunState(Words):
    """The run in a word (`state` in `orch status --json`, the badge of its page, `orch runs`):
    each member's word, then what it means."""

    PREPARED = "prepared", "prepared, no worker launched yet"
    RUNNING = "running", "a worker beats, or a job is queued, starting or recovering"
    STOPPED = "stopped", "workers were launched, none runs now, and chunks are left (`orch resume`)"
    CANCELLED = "cancelled", "`orch cancel` stopped it; `orch resume` goes on"
    COMPLETE = "complete", "every chunk has a marker and nothing is damaged"
    DAMAGED = "damaged", "every chunk has a marker, but some cannot be collected (`orch redo` them)"

    def is_terminal(self) -> bool:
        """Nothing more happens unless a person acts (`orch redo`, `orch resume`)."""
        return self in RUN_TERMINAL

    def is_failure(self) -> bool:
        return self in RUN_FAILURES


class WorkerActivity(Words):
    """What a worker does (`activity` of each worker, the `doing` column): each member's words,
    then what they mean."""

    NOT_LAUNCHED = "not launched", "planned, no job yet"
    LAUNCHED = "launched", "a job was submitted; the backend says nothing more (or was not asked)"
    QUEUED = "queued", "its job waits for the scheduler or for capacity"
    PROVISIONING = "provisioning", "its machine is being started and set up"
    RECOVERING = "recovering", "its machine was lost, or the backend's check of it failed; the backend starts another"
    STARTING = "starting", "the worker program started and looks for work (or waits on an older twin)"
    LOADING = "loading", "the worker loads the model into its engine"
    WORKING = "working", "the worker answers a chunk's rows"
    BETWEEN_CHUNKS = "between chunks", "the worker finished a chunk and looks for the next one"
    DRAINING = "draining", "cancelled or stopping: it flushes its finished rows and gives its leases back"
    SILENT = "silent", "no heartbeat for more than two intervals: the store may be out of its reach, or it hangs"
    EXITED = "exited", "the worker program ended"
    FINISHED = "finished", "its job ended with the worker's success"
    FAILED = "failed", "its job failed (see the reason below the table)"
    CANCELLED = "cancelled", "its job was cancelled"
    GONE = "gone", "its last heartbeat is old and its job is not known: the process is gone"

    def is_going(self) -> bool:
        """The worker holds, or is about to hold, a machine that works for the run."""
        return self in GOING

    def is_terminal(self) -> bool:
        return self in ACTIVITY_TERMINAL


class Recovery(Words):
    """What the evidence says of a backend's recovery of a worker's job (a SkyPilot managed job
    RECOVERING, or recovered): whether its machine was really lost. Each member's word, then what it means."""

    SPURIOUS = (
        "spurious",
        (
            "the worker beats on while its job recovers (or its process outlived the recovery): the backend's "
            "check of the machine failed (a timeout under load), not the machine"
        ),
    )
    LOST = "machine lost", "the worker stopped beating without draining: its machine went away under it"


#: A run that stays as it is until a person acts.
RUN_TERMINAL = frozenset({RunState.COMPLETE, RunState.DAMAGED, RunState.STOPPED, RunState.CANCELLED})
#: A run that needs a person to be finished.
RUN_FAILURES = frozenset({RunState.DAMAGED, RunState.STOPPED})

#: Activities in which the run goes on: any of them makes the run `running`.
GOING = frozenset(
    {
        WorkerActivity.QUEUED,
        WorkerActivity.PROVISIONING,
        WorkerActivity.RECOVERING,
        WorkerActivity.STARTING,
        WorkerActivity.LOADING,
        WorkerActivity.WORKING,
        WorkerActivity.BETWEEN_CHUNKS,
        WorkerActivity.DRAINING,
        WorkerActivity.SILENT,
    }
)
#: Activities after which the worker's job does nothing more (a relaunch is a new job: `launched` again).
ACTIVITY_TERMINAL = frozenset(
    {
        WorkerActivity.EXITED,
        WorkerActivity.FINISHED,
        WorkerActivity.FAILED,
        WorkerActivity.CANCELLED,
        WorkerActivity.GONE,
    }
)
#: Activities that say something went wrong with the worker.
ACTIVITY_FAILURES = frozenset({WorkerActivity.FAILED, WorkerActivity.GONE, WorkerActivity.SILENT})

#: How the terminal colours a run's state (`orch status`'s header, `orch runs`); the page's badge
#: takes the same colour by name.
RUN_STATE_COLOURS: Mapping[RunState, str] = {
    RunState.PREPARED: "white",
    RunState.RUNNING: "blue",
    RunState.STOPPED: "yellow",
    RunState.CANCELLED: "yellow",
    RunState.COMPLETE: "green",
    RunState.DAMAGED: "red",
}
#: How the terminal and the page colour a worker's activity.
ACTIVITY_COLOURS: Mapping[WorkerActivity, str] = {
    WorkerActivity.NOT_LAUNCHED: "white",
    WorkerActivity.LAUNCHED: "white",
    WorkerActivity.QUEUED: "yellow",
    WorkerActivity.PROVISIONING: "cyan",
    WorkerActivity.RECOVERING: "yellow",
    WorkerActivity.STARTING: "cyan",
    WorkerActivity.LOADING: "cyan",
    WorkerActivity.WORKING: "green",
    WorkerActivity.BETWEEN_CHUNKS: "green",
    WorkerActivity.DRAINING: "yellow",
    WorkerActivity.SILENT: "red",
    WorkerActivity.EXITED: "white",
    WorkerActivity.FINISHED: "green",
    WorkerActivity.FAILED: "red",
    WorkerActivity.CANCELLED: "yellow",
    WorkerActivity.GONE: "red",
}

_R, _A = RunState, WorkerActivity  # short names for the table
#: The moves of a run, and of a worker from its launch to its end.
_TABLE: dict[tuple[enum.Enum, enum.Enum], str] = {
    (_R.PREPARED, _R.RUNNING): "`orch launch`: a job is queued or a worker beats",
    (_R.PREPARED, _R.STOPPED): "launched jobs ended before a reading saw them go",
    (_R.PREPARED, _R.CANCELLED): "`orch cancel` before any worker ran",
    (_R.RUNNING, _R.COMPLETE): "the last chunk's marker is written and nothing is damaged",
    (_R.RUNNING, _R.DAMAGED): "the last chunk's marker is written, and a marker or its parts do not match",
    (_R.RUNNING, _R.STOPPED): "every job ended (failed, or relaunches spent) with chunks left",
    (_R.RUNNING, _R.CANCELLED): "`orch cancel`",
    (_R.STOPPED, _R.RUNNING): "`orch resume`, or the watch loop relaunches a worker",
    (_R.STOPPED, _R.CANCELLED): "`orch cancel` on a stopped run",
    (_R.STOPPED, _R.COMPLETE): "the last worker wrote the last marker as it ended",
    (_R.CANCELLED, _R.RUNNING): "`orch resume`",
    (_R.DAMAGED, _R.RUNNING): "`orch redo` the damaged chunks, then `orch resume`",
    (_R.DAMAGED, _R.STOPPED): "`orch redo` with no worker running",
    (_R.COMPLETE, _R.RUNNING): "`orch redo` a chunk while a worker runs",
    (_R.COMPLETE, _R.STOPPED): "`orch redo` a chunk with no worker running",
    (_A.NOT_LAUNCHED, _A.LAUNCHED): "a job was submitted",
    (_A.NOT_LAUNCHED, _A.QUEUED): "a job was submitted and waits",
    (_A.NOT_LAUNCHED, _A.STARTING): "a local worker's process started",
    (_A.LAUNCHED, _A.QUEUED): "the backend says the job waits",
    (_A.LAUNCHED, _A.STARTING): "the worker's process started",
    (_A.QUEUED, _A.PROVISIONING): "the scheduler gave it a machine",
    (_A.QUEUED, _A.STARTING): "the worker's process started",
    (_A.QUEUED, _A.CANCELLED): "cancelled while queued",
    (_A.QUEUED, _A.FAILED): "no capacity for any candidate",
    (_A.PROVISIONING, _A.STARTING): "the machine is up and the worker program started",
    (_A.PROVISIONING, _A.FAILED): "set-up failed",
    (_A.PROVISIONING, _A.RECOVERING): "the machine was lost while it was set up",
    (_A.STARTING, _A.LOADING): "the worker found work and loads the model",
    (_A.STARTING, _A.EXITED): "no work left: the worker ended before loading",
    (_A.LOADING, _A.WORKING): "the engine is loaded and takes a chunk",
    (_A.LOADING, _A.BETWEEN_CHUNKS): "the engine is loaded; the chunk it meant to take was taken",
    (_A.WORKING, _A.BETWEEN_CHUNKS): "the chunk's marker is written",
    (_A.BETWEEN_CHUNKS, _A.WORKING): "it took the next chunk",
    (_A.BETWEEN_CHUNKS, _A.EXITED): "no chunk left: the worker ends",
    (_A.WORKING, _A.DRAINING): "`orch cancel`, or SIGTERM (a preemption notice)",
    (_A.BETWEEN_CHUNKS, _A.DRAINING): "`orch cancel`, or SIGTERM",
    (_A.LOADING, _A.DRAINING): "`orch cancel`, or SIGTERM",
    (_A.STARTING, _A.DRAINING): "`orch cancel`, or SIGTERM",
    (_A.DRAINING, _A.EXITED): "the finished rows are flushed and the leases given back",
    (_A.DRAINING, _A.CANCELLED): "its job ended as cancelled",
    (_A.EXITED, _A.FINISHED): "its job ended with the worker's exit 0",
    (_A.EXITED, _A.FAILED): "its job ended with a non-zero exit",
    (_A.EXITED, _A.CANCELLED): "its job ended as cancelled",
    (_A.EXITED, _A.GONE): "the backend forgot the job",
    (_A.SILENT, _A.WORKING): "a heartbeat came again (the store was out of reach)",
    (_A.SILENT, _A.BETWEEN_CHUNKS): "a heartbeat came again",
    (_A.SILENT, _A.LOADING): "a heartbeat came again",
    (_A.SILENT, _A.RECOVERING): "the backend found its machine lost",
    (_A.SILENT, _A.FAILED): "its job failed (killed, or out of memory)",
    (_A.SILENT, _A.GONE): "no heartbeat for six intervals and the job is not known",
    (_A.RECOVERING, _A.PROVISIONING): "the backend provisions another machine",
    (_A.RECOVERING, _A.STARTING): "the worker program started on the new machine",
    (_A.RECOVERING, _A.FAILED): "the backend gave up recovering it",
}
# Any live activity may fall silent (no heartbeat: a hang, the store out of reach), and a worker
# that beats may be killed (its job fails) or its machine lost (recovering) at any moment.
_FROM_ANY_LIVE = {
    _A.SILENT: "no heartbeat for two intervals",
    _A.FAILED: "its process was killed, or exited non-zero",
    _A.RECOVERING: "the backend found its machine lost (or its check failed)",
    _A.CANCELLED: "its job was cancelled before it could drain",
}
#: A job that ended is replaced by a new one: the watch loop relaunches a failed worker, `orch
#: resume` a cancelled one, a launch after `orch redo` a finished one.
_RELAUNCH = {
    _A.LAUNCHED: "relaunched: a new job was submitted",
    _A.QUEUED: "relaunched: its new job waits",
    _A.STARTING: "relaunched: a new local process started",
}
#: Every move between two readings in a row, and what makes it. A move not listed is a bug in the
#: derivation (the tests watch real runs against this table).
MOVES: Mapping[tuple[enum.Enum, enum.Enum], str] = {
    **_TABLE,
    **{(ended, after): why for ended in ACTIVITY_TERMINAL for after, why in _RELAUNCH.items()},
    **{
        (live, after): why
        for live in (_A.STARTING, _A.LOADING, _A.WORKING, _A.BETWEEN_CHUNKS, _A.DRAINING)
        for after, why in _FROM_ANY_LIVE.items()
    },
}


def moves_from(state: enum.Enum) -> frozenset[enum.Enum]:
    """Where one move from `state` may lead."""
    return frozenset(after for before, after in MOVES if before is state)


def reachable(before: enum.Enum, after: enum.Enum) -> bool:
    """Whether a later reading may show `after` where an earlier one showed `before` (the same
    state, or any path of moves: readings far apart skip the states between)."""
    seen, frontier = {before}, [before]
    while frontier:
        for nxt in moves_from(frontier.pop()):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return after in seen

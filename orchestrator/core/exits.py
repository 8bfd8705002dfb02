"""How a worker process ends: the status its summary line names, and the exit code it leaves.

The worker, its replicas' parent, the local backend, SkyPilot's task and the controller all read
these codes; each reads them from here, so a code means one thing everywhere.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class WorkerExit(IntEnum):
    """A worker's exit code (also the heartbeat's `exit_code`)."""

    #: No work left; or a newer process of a worker id that already runs (the older one works on).
    DONE = 0
    #: An error (the engine, the store, a bug): a failed worker, relaunched within the retry budget.
    FAILED = 1
    #: The store stayed unreachable past store_settings.outage_budget (sysexits' EX_TEMPFAIL):
    #: started again without counting as a failure (SkyPilot's `recover_on_exit_codes` too).
    STORE_UNREACHABLE = 75
    #: Killed by Ctrl-C before it could stop itself, as a shell reports it (128 + SIGINT): a stop.
    INTERRUPTED = 130
    #: Stopped by SIGTERM/SIGINT (a spot preemption notice, `orch cancel`, Ctrl-C), exiting as a
    #: SIGTERM death would (128 + SIGTERM): finished rows flushed, leases given back.
    STOPPED = 143


class WorkerStatus(str, Enum):
    """The `status` of a worker's JSON summary line (the last line on its stdout)."""

    #: Every chunk it could get is done.
    SUCCESS = "SUCCESS"
    #: Another, older process of this worker id is alive: this one stopped before loading an engine.
    DUPLICATE = "DUPLICATE"
    #: Stopped by a signal or `orch cancel` (finished rows flushed).
    INTERRUPTED = "INTERRUPTED"
    #: Gave up waiting for the store (core/protocol/outage.py).
    STORE_UNREACHABLE = "STORE_UNREACHABLE"
    #: An error ended it.
    FAILED = "FAILED"

    @property
    def exit_code(self) -> WorkerExit:
        return _EXITS[self]

    @staticmethod
    def of_exit(code: int) -> WorkerStatus:
        """The status a process's exit code stands for (a replica's, read by its parent)."""
        return next((status for status, exit in _EXITS.items() if exit == code), WorkerStatus.FAILED)


#: Each status's exit code; SUCCESS before DUPLICATE, so that 0 reads as SUCCESS.
_EXITS = {
    WorkerStatus.SUCCESS: WorkerExit.DONE,
    WorkerStatus.DUPLICATE: WorkerExit.DONE,
    WorkerStatus.INTERRUPTED: WorkerExit.STOPPED,
    WorkerStatus.STORE_UNREACHABLE: WorkerExit.STORE_UNREACHABLE,
    WorkerStatus.FAILED: WorkerExit.FAILED,
}

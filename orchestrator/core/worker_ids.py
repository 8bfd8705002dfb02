"""Worker ids: what a worker is called in heartbeats, leases and markers, and how the names are read back.

A worker id is the plan's list number ("3"), or any name for a worker outside the plan (it only
steals). On a multi-GPU machine, `--replicas N` runs one engine process per GPU set, each with its
own id, `<worker>r<replica>` ("3r0", "3r1"): they claim chunks on their own, and `status` shows
them under the worker (the backend job) that started them.
"""

from __future__ import annotations

import re

_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_REPLICA = re.compile(r"^(\d+)r(\d+)$")


def check_worker_id(worker: str) -> str:
    if not _WORKER_ID.match(worker or ""):
        from orchestrator.core.errors import SpecError

        raise SpecError(f"invalid worker id {worker!r}", hint="letters, digits, '.', '_' and '-'")
    return worker


def replica_id(worker: str, replica: int | None) -> str:
    """The id of one replica of a worker (the worker's own id when it runs a single engine)."""
    return worker if replica is None else f"{worker}r{replica}"


def planned_list(worker_id: str) -> int | None:
    """The plan list a worker (or a replica of it) starts on; None for a worker outside the plan."""
    base = job_worker(worker_id)
    return int(base) if base.isdigit() else None


def job_worker(worker_id: str) -> str:
    """The worker whose backend job runs this id: "3" for "3" and for its replicas "3r0", "3r1"."""
    match = _REPLICA.match(worker_id)
    return match.group(1) if match else worker_id


def sort_key(worker_id: str) -> tuple[int, str]:
    """Planned workers in number order (replicas after their worker), then the others by name."""
    listed = planned_list(worker_id)
    return (listed if listed is not None else 1 << 30, worker_id)

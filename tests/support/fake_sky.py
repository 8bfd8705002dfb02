"""A scripted stand-in for SkyPilot's API server: the one boundary tests cannot reach (the clouds).

Everything else in the SkyPilot path is real: the task template, SkyPilot's own YAML loader, the
sky.Task objects handed to `launch`, and orch's launcher and reconcile loop around it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any


class ResourcesUnavailableError(Exception):
    """Named like SkyPilot's own: no capacity for any candidate."""


class ClusterNotUpError(Exception):
    """Named like SkyPilot's own: the jobs controller is not up."""


class ScriptedSky:
    """`launch` records tasks and hands out job ids; `queue` plays each job's scripted states,
    one step per call (the last state repeats); `down` makes every call fail."""

    def __init__(self, *, latency: float = 0.0, script: Sequence[str] = ("RUNNING",), fail_workers: Sequence[str] = ()):
        self.latency = latency
        self.default_script = list(script)
        self.fail_names = set(fail_workers)
        self.launched: list[tuple[int, Any, str]] = []
        self.scripts: dict[int, list[dict[str, Any]]] = {}
        self.cancelled: list[int] = []
        self.down = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.concurrent = 0
        self.max_concurrent = 0

    def script_job(self, job_id: int, states: Sequence[str | dict[str, Any]]) -> None:
        self.scripts[job_id] = [s if isinstance(s, dict) else {"status": s} for s in states]

    def launch(self, task: Any, name: str) -> list[int]:
        with self._lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            time.sleep(self.latency)
            if self.down:
                raise ClusterNotUpError("jobs controller is not up")
            if any(name.endswith(f"-w{w}") for w in self.fail_names):
                raise ResourcesUnavailableError("Failed to acquire resources in all zones")
            with self._lock:
                job_id = next(self._ids)
                self.launched.append((job_id, task, name))
                self.scripts.setdefault(job_id, [{"status": s} for s in self.default_script])
            return [job_id]
        finally:
            with self._lock:
                self.concurrent -= 1

    def queue(self, job_ids: Sequence[int]) -> list[dict[str, Any]]:
        if self.down:
            raise ClusterNotUpError("jobs controller is not up")
        records = []
        for job_id in job_ids:
            steps = self.scripts.get(job_id)
            if not steps:
                continue  # unknown to SkyPilot
            step = steps.pop(0) if len(steps) > 1 else steps[0]
            records.append({"job_id": job_id, "recovery_count": 0, **step})
        return records

    def unfinished_named(self, name_part: str) -> list[dict[str, Any]]:
        if self.down:
            raise ClusterNotUpError("jobs controller is not up")
        finished = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE"}
        return [
            {"job_id": job_id, "job_name": name, **self.scripts[job_id][0]}
            for job_id, _task, name in self.launched
            if name_part in name and self.scripts[job_id][0]["status"] not in finished
        ]

    def cancel(self, job_ids: Sequence[int]) -> None:
        self.cancelled += list(job_ids)
        for job_id in job_ids:
            self.scripts[job_id] = [{"status": "CANCELLED"}]

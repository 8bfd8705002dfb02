"""The SkyPilot backend: each worker is a managed job; SkyPilot picks the cheapest GPU and recovers preemptions.

All workers are submitted at once (a thread per submission: `sky.jobs.launch` returns a request
id, `sky.get` waits for the job ids), never a shell loop of background processes. Everything
that reaches SkyPilot's API server, and through it the clouds, goes through `SkyPilotSDK`: the
one seam the tests replace.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.backends.base import JobState, JobStatus, LaunchRequest
from orchestrator.backends.skypilot_render import load_task, load_template, render_worker_task, to_yaml
from orchestrator.core.errors import BackendError, LaunchFailed
from orchestrator.core.records import Heartbeat
from orchestrator.core.spec import RunSpec

#: What `status` and the zone history read of each job; queue_v2's default fields leave out cloud,
#: region, zone and reasons.
QUEUE_FIELDS = [
    "job_id",
    "job_name",
    "status",
    "recovery_count",
    "cloud",
    "region",
    "zone",
    "cluster_resources",
    "accelerators",
    "failure_reason",
    "submitted_at",
    "start_at",
    "end_at",
    "last_recovered_at",
]
_STATES = {s.value: s for s in JobState} | {"SUBMITTED": JobState.PENDING}


class _ProgressToStderr:
    """SkyPilot's SDK says its progress ("Uploading files to API server", "View logs") on stdout,
    which is orch's answer to a program (`orch estimate --probe --json`): it goes to stderr while
    any SDK call is under way. Its logging handlers hold the stdout of the moment SkyPilot set them
    up, so a swapped `sys.stdout` alone does not reach them (the Slurm probe's JSON began with
    those lines): each handler of a `sky` logger writing to stdout is pointed at stderr too.

    Calls overlap (the launcher's threads, the web page's status threads), so the first to enter
    swaps and the last to leave puts back: `contextlib.redirect_stdout` in two threads at once
    would leave stdout on stderr for good (the second saves what the first swapped in)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._stdout: Any = None
        self._moved: list[tuple[logging.StreamHandler[Any], Any]] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._swap()
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    self._put_back()

    def _swap(self) -> None:
        loggers = [logging.getLogger("sky")] + [
            logger
            for name, logger in list(logging.Logger.manager.loggerDict.items())
            if name.startswith("sky.") and isinstance(logger, logging.Logger)
        ]
        stdout = {id(sys.stdout), id(sys.__stdout__)}
        self._moved = [
            (handler, handler.setStream(sys.stderr))
            for logger in loggers
            for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in stdout
        ]
        self._stdout, sys.stdout = sys.stdout, sys.stderr

    def _put_back(self) -> None:
        sys.stdout = self._stdout
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved = []


#: `with progress_to_stderr():` around the calls into SkyPilot's SDK.
progress_to_stderr = _ProgressToStderr()


class SkyPilotSDK:
    """SkyPilot's client SDK, the calls orch makes. Each blocks until the API server answers, and
    what SkyPilot says meanwhile goes to stderr (progress_to_stderr; the launcher holds it around
    its concurrent launches)."""

    def launch(self, task: Any, name: str) -> list[int]:
        import sky

        job_ids, _ = sky.get(sky.jobs.launch(task, name=name))
        if not job_ids:
            raise BackendError(f"SkyPilot returned no job id for {name}")
        return list(job_ids)

    def queue(self, job_ids: Sequence[int]) -> list[Any]:
        import sky

        with progress_to_stderr():
            records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=list(job_ids), fields=QUEUE_FIELDS))
        return list(records)

    def cancel(self, job_ids: Sequence[int]) -> None:
        import sky

        with progress_to_stderr():
            sky.get(sky.jobs.cancel(job_ids=list(job_ids)))

    def unfinished_named(self, name_part: str) -> list[Any]:
        """Managed jobs not finished yet whose name contains `name_part` (SkyPilot matches a substring)."""
        import sky

        request = sky.jobs.queue_v2(refresh=False, skip_finished=True, name_match=name_part, fields=QUEUE_FIELDS)
        with progress_to_stderr():
            records, *_ = sky.get(request)
        return list(records)


class SkyPilotLauncher:
    name = "skypilot"

    def __init__(
        self, spec: RunSpec, *, sdk: Any = None, template: dict[str, Any] | None = None, max_parallel: int = 32
    ):
        self.spec = spec
        self.sdk = sdk or SkyPilotSDK()
        self.template = template if template is not None else load_template(spec.resources.task_template)
        self.max_parallel = max_parallel

    def launch(self, requests: Sequence[LaunchRequest]) -> dict[int, str]:
        # Render and check every task first: a bad template fails before anything is launched.
        tasks = [
            (
                r,
                load_task(
                    to_yaml(render_worker_task(self.template, self.spec, r)),
                    secrets=sorted(r.secrets.items()),
                    where=f"worker {r.worker}",
                ),
            )
            for r in requests
        ]
        launched: dict[int, str] = {}
        failures: dict[int, str] = {}
        with (
            progress_to_stderr(),
            ThreadPoolExecutor(max_workers=max(1, min(self.max_parallel, len(tasks)))) as pool,
        ):
            futures = {pool.submit(self.sdk.launch, task, r.name): r for r, task in tasks}
            for future, request in futures.items():
                try:
                    launched[request.worker] = str(future.result()[0])
                except Exception as e:  # one worker's failure must not hide the others' launches
                    failures[request.worker] = _reason(e, self.spec)
        if failures:
            raise LaunchFailed(launched, failures, hint=_hint(failures))
        return launched

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Raises BackendError when SkyPilot cannot be asked (no API server, no jobs controller):
        "unknown" must never read as "gone", or the watch loop would launch duplicates."""
        if not job_ids:
            return {}
        try:
            records = self.sdk.queue([int(j) for j in job_ids])
        except Exception as e:
            raise BackendError(
                f"cannot get job states from SkyPilot: {type(e).__name__}: {e}",
                hint="is the SkyPilot API server up (sky api info)?",
            ) from None
        by_id = {str(_get(r, "job_id")): r for r in records}
        return {
            j: _status(j, by_id[j])
            if j in by_id
            else JobStatus(j, JobState.UNKNOWN, failure_reason="not in SkyPilot's job queue")
            for j in job_ids
        }

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self.sdk.cancel([int(j) for j in job_ids])

    def find_strays(self, run: str, known: Sequence[str], beats: Sequence[Heartbeat]) -> dict[str, str]:  # noqa: ARG002 - the job is the unit here
        """Managed jobs named like this run's workers (`orch-<run>-w<i>`) that the jobs record does
        not know (a launch whose controller died before recording it). Processes inside a known
        job are the job's business; `cancel.json` in the store stops any that remain."""
        pattern = re.compile(rf"orch-{re.escape(run)}-w\d+")
        try:
            records = self.sdk.unfinished_named(f"orch-{run}-w")
        except Exception as e:
            raise BackendError(f"cannot list SkyPilot's jobs: {type(e).__name__}: {e}") from None
        strays = {
            str(_get(r, "job_id")): str(_get(r, "job_name"))
            for r in records
            if pattern.fullmatch(str(_get(r, "job_name") or "")) and str(_get(r, "job_id")) not in set(known)
        }
        return {job_id: f"job {job_id} ({name})" for job_id, name in sorted(strays.items())}

    def stop_strays(self, handles: Sequence[str]) -> None:
        self.cancel(handles)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _get(record: Any, field: str) -> Any:
    """A field of a queue record (SkyPilot's ManagedJobRecord, or a dict); SkyPilot writes '-'
    for what a job that never got a machine does not have (cloud, region, resources)."""
    value = record.get(field) if isinstance(record, dict) else getattr(record, field, None)
    return None if value == "-" else value


def _status(job_id: str, record: Any) -> JobStatus:
    raw = _get(record, "status")
    state = _STATES.get(getattr(raw, "value", raw) or "", JobState.UNKNOWN)
    accelerators = _get(record, "accelerators") or {}
    resources = str(_get(record, "cluster_resources") or "")
    reason = _get(record, "failure_reason")
    return JobStatus(
        job_id=job_id,
        state=state,
        recovery_count=int(_get(record, "recovery_count") or 0),
        accelerator=next(iter(accelerators), None),
        cloud=_get(record, "cloud"),
        region=_get(record, "region"),
        zone=_get(record, "zone"),
        spot=("[spot]" in resources.lower()) if resources else None,
        failure_reason=_ANSI.sub("", reason) if reason else None,  # SkyPilot colours its hints
        started_at=_get(record, "start_at"),
        # SkyPilot writes -1 for "never recovered" (and sets it when a recovery starts running).
        running_since=max(_get(record, "last_recovered_at") or -1, _get(record, "start_at") or -1, 0) or None,
        ended_at=_get(record, "end_at"),
        log=f"sky jobs logs {job_id}",
    )


def _reason(e: Exception, spec: RunSpec) -> str:
    if type(e).__name__ == "ResourcesUnavailableError":
        kinds = " or ".join(
            k for k, ok in (("spot", spec.resources.spot), ("on-demand", spec.resources.on_demand)) if ok
        )
        return f"no capacity for any of {', '.join(spec.resources.gpus)} ({kinds}): {str(e).splitlines()[0][:200]}"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _hint(failures: dict[int, str]) -> str:
    if any("no capacity" in why for why in failures.values()):
        return "widen --gpus or allow on-demand; `orch launch` again launches just the missing workers"
    return "`orch launch` again launches just the missing workers"

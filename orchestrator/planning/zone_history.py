"""Keeping each zone's record for a run (zones.json): spot jobs seen up, preempted, and getting capacity again.

A spot job's life, as the reconcile loop polls it, is a series of up spells in some zone, each ended
by a preemption (SkyPilot: RECOVERING, or a recovery_count that went up between two polls) or by
the job's end, and separated by waits for capacity. Per zone that gives what ZoneModel
(planning/spot_zones.py) learns from: machine-time up and preemptions (an up spell that ended
without a preemption is censored: its time counts, no spell end does), plus the time to capacity.

The transitions are plain functions of the history, so the simulator's fleet (simulate/fleet_zones.py)
keeps its zones' record with the same code as `orch watch`. Times are those of the polls that saw
them: a spell is known to within one watch interval.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.backends.base import JobState, JobStatus
from orchestrator.core.context import RunContext
from orchestrator.core.records import JobAttempt, ZoneHistory, ZoneTally, ZoneWatch, update_zone_history


def place_of(status: JobStatus) -> str | None:
    """`cloud/region/zone` (as far as the backend says) where the job runs; None when it does not say."""
    if not status.cloud:
        return None
    parts = [status.cloud.lower(), status.region, status.zone]
    return "/".join(p for p in parts if p)


def started(history: ZoneHistory, job: str, worker: int, place: str, now: float, *, since: float) -> str:
    """The job is up in `place` (first seen so at `now`), having waited since `since`."""
    watch = history.jobs.setdefault(job, ZoneWatch(worker=worker, waiting_since=since))
    tally = history.zones.setdefault(place, ZoneTally())
    waited = max(now - watch.waiting_since, 0.0)
    tally.waits += 1
    tally.wait_s += waited
    watch.place, watch.up_since = place, now
    return f"worker {worker}: capacity in {place} after {_minutes(waited)}"


def preempted(history: ZoneHistory, job: str, now: float) -> str | None:
    """The job's machine was taken away: its up spell ends with a preemption of its zone."""
    watch = history.jobs.get(job)
    if watch is None or watch.up_since is None or watch.place is None:
        return None
    tally = history.zones.setdefault(watch.place, ZoneTally())
    up = max(now - watch.up_since, 0.0)
    tally.up_s += up
    tally.preemptions += 1
    watch.up_since, watch.waiting_since = None, now
    return f"worker {watch.worker}: preempted in {watch.place} after {_minutes(up)} up"


def ended(history: ZoneHistory, job: str, now: float) -> None:
    """The job is over (or no longer the worker's): a running spell counts as time up, not as a preemption."""
    watch = history.jobs.pop(job, None)
    if watch is not None and watch.up_since is not None and watch.place is not None:
        tally = history.zones.setdefault(watch.place, ZoneTally())
        tally.up_s += max(now - watch.up_since, 0.0)
        tally.ended += 1


def observe(
    history: ZoneHistory, current: Mapping[int, JobAttempt], statuses: Mapping[str, JobStatus], now: float
) -> list[str]:
    """One poll of the workers' current jobs applied to the history; what happened, in words.

    1. Jobs followed that are no longer a worker's current job, or that ended: their spells close.
    2. A spot job whose recovery count went up, or that is RECOVERING: preempted in its zone.
    3. A spot job RUNNING and not up yet: capacity found, where SkyPilot placed it."""
    events: list[str] = []
    jobs = {a.job_id: (w, a) for w, a in current.items() if not a.pending and a.use_spot is not False}
    for job in list(history.jobs):
        status = statuses.get(job)
        if job not in jobs or (status is not None and status.state.is_terminal()):
            ended(history, job, (status.ended_at if status else None) or now)
    for job, (worker, attempt) in sorted(jobs.items()):
        status = statuses.get(job)
        if status is None or status.spot is False or status.state.is_terminal():
            continue
        watch = history.jobs.get(job)
        if watch is not None and (status.state is JobState.RECOVERING or status.recovery_count > watch.recoveries):
            events += [e for e in (preempted(history, job, now),) if e]
        place = place_of(status)
        if status.state is JobState.RUNNING and place and (watch is None or watch.up_since is None):
            # Followed from its first placement on: until then a job has no zone to learn about.
            since = watch.waiting_since if watch is not None else attempt.launched_at
            events.append(started(history, job, worker, place, now, since=since))
        if job in history.jobs:
            history.jobs[job].recoveries = status.recovery_count
    return events


def record_zones(
    ctx: RunContext, current: Mapping[int, JobAttempt], statuses: Mapping[str, JobStatus], now: float
) -> list[str]:
    """`observe` on the run's zones.json, written back only when something changed."""
    events: list[str] = []

    def change(history: ZoneHistory) -> bool:
        before = history.model_dump(exclude={"write_id", "updated_at"})
        events[:] = observe(history, current, statuses, now)
        history.updated_at = now
        return history.model_dump(exclude={"write_id", "updated_at"}) != before

    update_zone_history(ctx.store, ctx.layout, change)
    return events


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"

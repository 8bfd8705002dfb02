"""Launching workers: build each worker's settings and secrets, skip live ones, reserve, submit, record the jobs.

One worker id has at most one live job, whichever controller asks (two `orch launch` at once, two
`orch watch` relaunching the same dead worker): a launch is reserved in the run's jobs record by
compare-and-swap before anything is submitted, and only for a worker whose current job is still
the one this controller judged not live. The controller that loses the race launches nothing.
Chosen over a controller lease on the run: it covers every path that launches (launch, resume,
watch, the deadline policy) with no lease to renew or to wait out when a controller dies, and a
second `orch watch` stays useful (either can go away).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.backends import backend_for
from orchestrator.backends.base import JobState, JobStatus, Launcher, LaunchRequest, attempt_statuses, orphaned
from orchestrator.core.context import RunContext
from orchestrator.core.errors import LaunchFailed
from orchestrator.core.pools import POOL_ENV, run_models
from orchestrator.core.processes import alive as process_alive
from orchestrator.core.processes import this_process
from orchestrator.core.protocol.adapters import ship_adapters
from orchestrator.core.protocol.claims import pool_of
from orchestrator.core.protocol.heartbeats import STALE_AFTER_BEATS, live_heartbeats, read_heartbeats
from orchestrator.core.records import (
    CancelRecord,
    JobAttempt,
    JobsRecord,
    PlanRecord,
    read_jobs,
    read_plan,
    update_jobs,
)
from orchestrator.planning.plan import run_plan, workers_needed
from orchestrator.planning.zone_steering import zone_order

#: Passed to workers as secrets when set here: never written to a file, a log or the store.
SECRET_NAMES = (
    "HF_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "R2_ACCOUNT_ID",
    "R2_ACCESS_KEY_ID",
    "R2_SECRET_ACCESS_KEY",
)
#: Plain settings passed through when set here (not secret: endpoints, regions).
PASSTHROUGH_NAMES = ("ORCH_S3_ENDPOINT_URL", "R2_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


def worker_envs(ctx: RunContext, worker: int, env: Mapping[str, str]) -> dict[str, str]:
    # A store on this machine is shared with local workers only: its absolute path needs no cwd.
    store = ctx.spec.store if ctx.store.shared else ctx.store.uri
    envs = {
        "ORCH_RUN": ctx.layout.run,
        "ORCH_STORE": store,
        "ORCH_WORKER": str(worker),
        "ORCH_WORKER_LIST": ctx.layout.worker_list(str(worker))[len(ctx.layout.root) :],
    }
    envs.update({k: env[k] for k in PASSTHROUGH_NAMES if env.get(k)})
    return envs


def worker_secrets(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in SECRET_NAMES if env.get(k)}


def launch_request(
    ctx: RunContext,
    worker: int,
    env: Mapping[str, str],
    use_spot: bool | None = None,
    zones: Sequence[str] = (),
    plan: PlanRecord | None = None,
    pool: str | None = None,
) -> LaunchRequest:
    """What the backend needs to start one worker: its job name, settings, secrets and zone order,
    and in a run of several models the model it loads (`pool` for a worker outside the plan, else
    its pool in `plan`, else in the run's plan)."""
    envs = worker_envs(ctx, worker, env)
    if ctx.spec.models and plan is None and pool is None:
        plan = read_plan(ctx.store, ctx.layout)
    pool = pool or (pool_of(plan, worker) if plan is not None else None)
    if pool is not None:
        envs[POOL_ENV] = pool
    return LaunchRequest(
        worker=worker,
        name=f"orch-{ctx.layout.run}-w{worker}",
        envs=envs,
        secrets=worker_secrets(env),
        use_spot=use_spot,
        zones=list(zones),
        model=pool,
    )


def live_workers(record: JobsRecord, statuses: Mapping[str, JobStatus]) -> set[int]:
    """Workers whose current job holds (or will soon hold) a machine, reservations included."""
    return {
        worker
        for worker, attempt in record.current_jobs().items()
        if attempt.job_id in statuses and statuses[attempt.job_id].state.is_live()
    }


@dataclass
class NeededLaunch:
    """What `launch_needed` found and did."""

    #: The chunks without a done marker: none means the run needs no worker (and none was launched).
    remaining: list[str]
    #: worker -> job id of the workers launched now.
    launched: dict[int, str] = field(default_factory=dict)
    #: Workers the unfinished chunks need that were running already: not launched again.
    running: list[int] = field(default_factory=list)

    @property
    def needed(self) -> list[int]:
        return sorted({*self.launched, *self.running})


def launch_needed(
    ctx: RunContext, launcher: Launcher, plan: PlanRecord | None = None, *, reason: str = "launch"
) -> NeededLaunch:
    """Launch the workers the run's unfinished chunks need (planning.plan.workers_needed), except
    those already live. The markers are listed again once the backend has been asked: a job it
    reports ended wrote its markers before it ended, so a worker that finished its list between the
    first listing and the backend's answer is not launched again to find nothing. The first listing
    spares a run with nothing left the backend's question."""
    plan = plan or run_plan(ctx)  # read once for both listings
    if not workers_needed(ctx, plan)[1]:
        return NeededLaunch(remaining=[])
    read_again: list[tuple[list[int], list[str]]] = []

    def still_needed() -> list[int]:
        read_again.append(workers_needed(ctx, plan))
        needed, remaining = read_again[-1]
        return needed if remaining else []

    launched = launch_workers(ctx, launcher, still_needed, reason=reason)
    needed, remaining = read_again[-1]
    return NeededLaunch(remaining, launched, sorted(w for w in needed if w not in launched) if remaining else [])


def launch_workers(
    ctx: RunContext,
    launcher: Launcher,
    workers: Iterable[int] | Callable[[], Iterable[int]],
    *,
    reason: str = "launch",
    use_spot: bool | None = None,
    count_as_relaunch: bool = False,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    zones: Sequence[str] | None = None,
    pool: str | None = None,
) -> dict[int, str]:
    """Launch the given workers, except those already live. Returns worker -> new job id.
    `workers`: the workers, or a function giving them, called once the backend has been asked
    (step 2: `launch_needed` reads the markers then).
    `pool`: a run of several models, workers outside the plan: the model they load (recorded with
    their jobs, so that a relaunch loads it again).
    `zones`: the spec's zones in the order to try (default: ranked now, planning/zone_steering.py).

    1. Ship the run's LoRA adapters given as local directories into the store (once): workers
       anywhere load them from there.
    2. Ask the backend about the current job of every worker: a live one is never duplicated.
    3. Reserve the others in the jobs record (compare-and-swap): a worker whose current job
       changed since step 2 was just launched by another controller, and is left to it.
    4. Submit the reserved ones all at once (the launcher submits concurrently).
    5. Record every job that was submitted in place of its reservation; a submission that failed
       is recorded as FAILED (the watch loop relaunches it within the retry budget).
    """
    env = os.environ if env is None else env
    ship_adapters(ctx.store, ctx.layout, ctx.spec.model.lora)
    for model in run_models(ctx.spec).values():
        ship_adapters(ctx.store, ctx.layout, model.lora)
    record, _ = read_jobs(ctx.store, ctx.layout)
    now = clock()
    statuses = current_statuses(ctx, launcher, record.current_jobs(), now)
    live = live_workers(record, statuses)
    chosen = set(workers() if callable(workers) else workers)
    judged = {w: (a.job_id if (a := record.worker(w).current) else None) for w in chosen if w not in live}
    if not judged:
        return {}
    ctx.store.delete(ctx.layout.cancel)  # an earlier `orch cancel` would stop the new workers at once
    token = f"pending-{uuid.uuid4().hex[:12]}"
    attempt = JobAttempt(
        job_id=token,
        backend=launcher.name,
        launched_at=now,
        reason=reason,
        use_spot=use_spot,
        pending=True,
        pool=pool,
        reserved_by=this_process(),
    )
    reserved = _reserve(ctx, judged, attempt, count_as_relaunch)
    if not reserved:
        return {}
    if zones is None:
        zones = [z.place for z in zone_order(ctx, now)]
    pools = {w: pool or next((a.pool for a in reversed(record.worker(w).attempts) if a.pool), None) for w in reserved}
    requests = [launch_request(ctx, w, env, use_spot, zones, pool=pools[w]) for w in reserved]
    failure: BaseException | None = None
    try:
        launched = launcher.launch(requests)
    except LaunchFailed as e:
        launched, failure = e.launched, e
    except BaseException as e:
        # Refused before anything was submitted (a task SkyPilot's loader rejects, Ctrl-C): the
        # reservations must end now, or they would block these workers as "launching" until
        # PENDING_TIMEOUT_S.
        launched, failure = {}, e
    _record_submissions(ctx, token, reserved, launched, failure, clock)
    if failure is not None:
        raise failure
    return launched


def _record_submissions(
    ctx: RunContext,
    token: str,
    reserved: Iterable[int],
    launched: Mapping[int, str],
    failure: BaseException | None,
    clock: Callable[[], float],
) -> None:
    """Step 5: each reservation becomes the job submitted for it, or FAILED with why it was not."""
    failures = failure.failures if isinstance(failure, LaunchFailed) else {}
    refused = f"{type(failure).__name__}: {failure}" if failure is not None and not failures else None

    def record(rec: JobsRecord) -> None:
        for w in reserved:
            attempt = next((a for a in rec.worker(w).attempts if a.job_id == f"{token}-w{w}"), None)
            if attempt is None:
                continue
            if w in launched:
                attempt.job_id, attempt.pending = launched[w], False
            else:
                attempt.ended_state, attempt.ended_at = "FAILED", clock()
                why = failures.get(w) or refused or "the backend did not say why"
                attempt.failure_reason = f"not submitted: {why}"

    update_jobs(ctx.store, ctx.layout, record)


def _reserve(
    ctx: RunContext, judged: Mapping[int, str | None], template: JobAttempt, count_as_relaunch: bool
) -> list[int]:
    """Step 2: a pending attempt (`template`, its job id the token + the worker) for each worker
    whose current job is still the one judged; those workers."""
    reserved: list[int] = []

    def reserve(rec: JobsRecord) -> None:
        reserved.clear()  # applied again when another controller wrote first
        rec.backend = template.backend
        if rec.cancelled_at is not None:  # launched again after a cancel: the time between is a pause
            rec.pauses.append((rec.cancelled_at, template.launched_at))
        rec.cancelled, rec.cancelled_at = False, None
        for w, seen in sorted(judged.items()):
            jobs = rec.worker(w)
            if (jobs.current.job_id if jobs.current else None) != seen:
                continue  # another controller launched it since we looked
            jobs.attempts.append(template.model_copy(update={"job_id": f"{template.job_id}-w{w}"}))
            jobs.relaunches += 1 if count_as_relaunch else 0
            reserved.append(w)

    update_jobs(ctx.store, ctx.layout, reserve)
    return reserved


@dataclass
class Cancelled:
    """What `cancel_workers` stopped."""

    #: Recorded jobs that were live and were cancelled.
    live: list[str] = field(default_factory=list)
    #: Workers of the run outside the recorded jobs (a lost launch, a twin), stopped too.
    strays: list[str] = field(default_factory=list)
    #: Jobs the record knew of, live or not: none means no worker was ever launched by orch.
    recorded: int = 0
    #: Jobs the backend still calls RUNNING with nothing running (backends.base.orphaned): not waited on.
    orphaned: list[str] = field(default_factory=list)


def current_statuses(
    ctx: RunContext, launcher: Launcher, current: Mapping[int, JobAttempt], now: float
) -> dict[str, JobStatus]:
    """What the backend says of each worker's current job (backends.base.attempt_statuses), except
    that a record it calls RUNNING with nothing running (backends.base.orphaned: its controller
    died with a restarted API server) reads as UNKNOWN, marked orphaned: no live worker, so
    `watch` relaunches it instead of waiting for good and `cancel` leaves it. Heartbeats are read
    only when some job has run long enough to be one."""
    statuses = attempt_statuses(launcher, current.values(), now)
    suspects = {w: statuses[a.job_id] for w, a in current.items() if a.job_id in statuses}
    suspects = {w: s for w, s in suspects.items() if orphaned(s, None, now=now)}
    if not suspects:
        return statuses
    beats = read_heartbeats(ctx.store, ctx.layout)
    for worker, status in suspects.items():
        beat = beats.get(str(worker))
        if orphaned(status, beat.updated_at if beat else None, now=now):
            silent = f"no heartbeat for {now - beat.updated_at:.0f}s" if beat else "no heartbeat ever"
            why = f"orphaned record: {status.state.value} since {now - (status.running_since or now):.0f}s, {silent}"
            statuses[status.job_id] = replace(status, state=JobState.UNKNOWN, failure_reason=why, orphaned=True)
    return statuses


def cancel_workers(ctx: RunContext) -> Cancelled:
    """Stop every worker of the run, tracked or not: `orch cancel`, Ctrl-C twice, and `orch serve`
    for a cancelled or expired batch.

    1. Mark the run cancelled in its jobs record, first: the reconcile loop relaunches nothing after.
    2. Find what the record does not know, before anything is told to stop (a worker that stops at
       step 3 is still found, and named as stopped): local worker processes by the pid and host in
       their heartbeats; SkyPilot jobs named like the run's workers.
    3. Write cancel.json, whatever step 2 met: every worker that heartbeats for the run stops at its
       next beat, wherever it runs and whoever launched it (the next launch removes it).
    4. Ask the backend that launched them which recorded jobs are live, and cancel those (workers
       flush their finished rows and give their leases back); then stop what step 2 found.
    """
    record = update_jobs(ctx.store, ctx.layout, _mark_cancelled)
    current = record.current_jobs()
    job_ids = [a.job_id for a in current.values() if not a.pending]
    launcher = backend_for(ctx, record.backend)
    now = time.time()
    try:
        interval = ctx.spec.workers.heartbeat_interval
        beats = live_heartbeats(ctx.store, ctx.layout, now=now, heartbeat_interval=interval)
        strays = launcher.find_strays(ctx.layout.run, job_ids, beats)
    finally:
        ctx.store.put(ctx.layout.cancel, CancelRecord(at=time.time(), by=this_process()).to_bytes())
    statuses = current_statuses(ctx, launcher, {w: a for w, a in current.items() if not a.pending}, now)
    orphans = [j for j, s in statuses.items() if s.orphaned]
    live = [j for j, s in statuses.items() if s.state.is_live()]
    launcher.cancel(live)
    launcher.stop_strays(list(strays))
    return Cancelled(live=live, strays=list(strays.values()), recorded=len(current), orphaned=orphans)


def stop_workers_and_wait(ctx: RunContext, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Stop every worker of the run and wait until none is alive: what `orch delete --force` does
    before deleting anything, so no worker writes into a deleted run (a heartbeat recreating it).

    1. cancel_workers: the record says cancelled, cancel.json tells every worker to stop at its next
       beat, live jobs are cancelled, stray processes stopped (local ones waited for, killed after
       the grace period).
    2. Until STALE_AFTER_BEATS heartbeat intervals (and one more, to look once after) have passed
       (a worker killed without a last beat is then stale everywhere): done once no heartbeat beats
       for a process that still runs (on this machine its pid tells; elsewhere its beat) and the
       backend has no live job of the run.
    Returns what is still alive at the deadline: nothing when every worker stopped."""
    cancel_workers(ctx)
    record, _ = read_jobs(ctx.store, ctx.layout)
    launcher = backend_for(ctx, record.backend)
    current = {w: a for w, a in record.current_jobs().items() if not a.pending}
    interval = ctx.spec.workers.heartbeat_interval
    deadline = time.monotonic() + (STALE_AFTER_BEATS + 1) * interval
    while True:
        now = time.time()
        host = socket.gethostname()
        beats = live_heartbeats(ctx.store, ctx.layout, now=now, heartbeat_interval=interval)
        alive = [
            f"worker {b.worker} (pid {b.pid} on {b.host})"
            for b in beats
            if not (b.host == host and b.pid is not None and not process_alive(b.pid))
        ]
        statuses = current_statuses(ctx, launcher, current, now) if current else {}
        alive += [f"job {j} ({s.state.value})" for j, s in statuses.items() if s.state.is_live() and not s.orphaned]
        if not alive or time.monotonic() >= deadline:
            return alive
        sleep(min(interval, 1.0))


def _mark_cancelled(rec: JobsRecord) -> None:
    """The run is cancelled from now (a second cancel keeps the first one's time)."""
    if not rec.cancelled or rec.cancelled_at is None:
        rec.cancelled_at = time.time()
    rec.cancelled = True


def dry_run_requests(
    ctx: RunContext,
    workers: Iterable[int],
    out_dir: Path,
    env: Mapping[str, str] | None = None,
    plan: PlanRecord | None = None,
) -> list[Path]:
    """`orch launch --dry-run`: each worker's SkyPilot task, rendered and checked, written to out_dir."""
    from orchestrator.backends.skypilot_render import write_dry_run

    env = os.environ if env is None else env
    zones = [z.place for z in zone_order(ctx, time.time())]
    requests = [launch_request(ctx, w, env, zones=zones, plan=plan) for w in sorted(set(workers))]
    return write_dry_run(ctx.spec, requests, out_dir)

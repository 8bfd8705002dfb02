"""Launching workers: build each worker's settings and secrets, skip live ones, submit, record the jobs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from orchestrator.backends import backend_for
from orchestrator.backends.base import JobStatus, Launcher, LaunchFailed, LaunchRequest
from orchestrator.core.context import RunContext
from orchestrator.core.protocol.adapters import ship_adapters
from orchestrator.core.records import JobAttempt, JobsRecord, read_jobs, update_jobs

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


def live_workers(record: JobsRecord, statuses: Mapping[str, JobStatus]) -> set[int]:
    """Workers whose current job holds (or will soon hold) a machine."""
    return {
        worker
        for worker, attempt in record.current_jobs().items()
        if attempt.job_id in statuses and statuses[attempt.job_id].state.is_live()
    }


def launch_workers(
    ctx: RunContext,
    launcher: Launcher,
    workers: Iterable[int],
    *,
    reason: str = "launch",
    use_spot: bool | None = None,
    count_as_relaunch: bool = False,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[int, str]:
    """Launch the given workers, except those already live. Returns worker -> new job id.

    1. Ship the run's LoRA adapters given as local directories into the store (once): workers
       anywhere load them from there.
    2. Ask the backend about the current job of every worker: a live one is never duplicated.
    3. Submit the others all at once (the launcher submits concurrently).
    4. Record every job that was submitted, even when some failed to submit, then report failures.
    """
    env = os.environ if env is None else env
    ship_adapters(ctx.store, ctx.layout, ctx.spec.model.lora)
    record, _ = read_jobs(ctx.store, ctx.layout)
    current = {w: a.job_id for w, a in record.current_jobs().items()}
    statuses = launcher.statuses(list(current.values())) if current else {}
    live = live_workers(record, statuses)
    requests = [
        LaunchRequest(
            worker=w,
            name=f"orch-{ctx.layout.run}-w{w}",
            envs=worker_envs(ctx, w, env),
            secrets=worker_secrets(env),
            use_spot=use_spot,
        )
        for w in sorted(set(workers))
        if w not in live
    ]
    if not requests:
        return {}
    failure: LaunchFailed | None = None
    try:
        launched = launcher.launch(requests)
    except LaunchFailed as e:
        launched, failure = e.launched, e
    now = clock()

    def record_launches(rec: JobsRecord) -> None:
        rec.backend = launcher.name
        rec.cancelled = False
        for w, job_id in launched.items():
            jobs = rec.worker(w)
            jobs.attempts.append(
                JobAttempt(job_id=job_id, backend=launcher.name, launched_at=now, reason=reason, use_spot=use_spot)
            )
            if count_as_relaunch:
                jobs.relaunches += 1

    if launched:
        update_jobs(ctx.store, ctx.layout, record_launches)
    if failure is not None:
        raise failure
    return launched


def cancel_workers(ctx: RunContext) -> list[str] | None:
    """Stop every worker of the run: `orch cancel`, and `orch serve` for a cancelled or expired batch.

    1. Mark the run cancelled in its jobs record, first: the reconcile loop relaunches nothing after.
    2. Ask the backend that launched them which current jobs are live, and cancel those (workers
       flush their finished rows and give their leases back).
    Returns the live jobs cancelled; None when no worker was ever launched.
    """
    record = update_jobs(ctx.store, ctx.layout, lambda rec: setattr(rec, "cancelled", True))
    job_ids = [a.job_id for a in record.current_jobs().values()]
    if not job_ids:
        return None
    launcher = backend_for(ctx, record.backend)
    live = [j for j, s in launcher.statuses(job_ids).items() if s.state.is_live()]
    launcher.cancel(live)
    return live


def dry_run_requests(ctx: RunContext, workers: Iterable[int], out_dir, env: Mapping[str, str] | None = None):
    """`orch launch --dry-run`: each worker's SkyPilot task, rendered and checked, written to out_dir."""
    from orchestrator.backends.skypilot_render import write_dry_run

    env = os.environ if env is None else env
    requests = [
        LaunchRequest(
            worker=w, name=f"orch-{ctx.layout.run}-w{w}", envs=worker_envs(ctx, w, env), secrets=worker_secrets(env)
        )
        for w in sorted(set(workers))
    ]
    return write_dry_run(ctx.spec, requests, out_dir)

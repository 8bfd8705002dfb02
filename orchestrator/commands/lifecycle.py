"""`orch launch`, `orch watch`, `orch resume`, `orch cancel`, `orch delete`: starting, keeping and
stopping a run's workers, and deleting a run once none is left."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.commands.shared import (
    Invocation,
    backend_option,
    common_options,
    follow_run,
    warn,
    workers_line,
)

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext
    from orchestrator.core.spec import RunSpec
    from orchestrator.core.store import ObjectInfo


@click.command("launch")
@common_options
@backend_option
@click.option("--workers", type=int, default=None, help="number of workers (replans if it differs from the plan)")
@click.option("--gpus", default=None, help="GPU candidates, comma-separated (default L4,L40S,A10G,A100,A100-80GB)")
@click.option(
    "--infra",
    default=None,
    help="where workers run, comma-separated, tried in order: slurm/CLUSTER, aws, gcp/us-central1, k8s",
)
@click.option("--spot", "spot_only", is_flag=True, help="spot instances only")
@click.option("--on-demand", "on_demand_only", is_flag=True, help="on-demand instances only")
@click.option("--dry-run", is_flag=True, help="render the SkyPilot task of every worker and launch nothing")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="where --dry-run writes")
@click.option(
    "--task-template",
    type=click.Path(exists=True, dir_okay=False, resolve_path=True),
    default=None,
    help="the SkyPilot task to render each worker from (a copy of task_templates/worker.yaml, edited); "
    "kept with the run for its relaunches (spec resources.task_template)",
)
@click.option("--follow", is_flag=True, help="then watch: relaunch failed workers until the run is complete")
@click.option("--interval", type=float, default=10.0, show_default=True, help="seconds between checks with --follow")
def launch_command(
    inv: Invocation,
    backend: str | None,
    workers: int | None,
    gpus: str | None,
    infra: str | None,
    spot_only: bool,
    on_demand_only: bool,
    dry_run: bool,
    out_dir: str | None,
    task_template: str | None,
    follow: bool,
    interval: float,
) -> int:
    """Launch one worker per planned list with unfinished chunks (never a second copy of a live
    worker; none at all when every chunk is done)."""
    from orchestrator.backends import backend_for
    from orchestrator.fleet.launch import launch_needed
    from orchestrator.planning.plan import ensure_plan

    if spot_only and on_demand_only:
        raise click.UsageError("--spot and --on-demand together mean both: leave both out for that")
    inv = inv.with_flags(
        backend=("skypilot" if dry_run and backend is None else backend),
        **{
            "workers.count": workers,
            "resources.gpus": [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None,
            "resources.infra": [i.strip() for i in infra.split(",") if i.strip()] if infra else None,
            "resources.spot": False if on_demand_only else None,
            "resources.on_demand": False if spot_only else None,
            "resources.task_template": task_template,
        },
    )
    # A dry run reads and renders: the spec is checked, not recorded, and a plan is made in memory.
    ctx = inv.context(freeze=not dry_run, check=dry_run, model="required")
    if dry_run and not ctx.store.shared:
        warn(
            f"the store {ctx.spec.store} is a directory on this machine: no cloud machine can reach it "
            "(use --store s3://BUCKET/PREFIX or r2://BUCKET/PREFIX)"
        )
    plan = ensure_plan(ctx, ctx.spec.workers.count, echo=click.echo, write=not dry_run)
    if dry_run:
        from orchestrator.fleet.launch import dry_run_requests

        paths = dry_run_requests(
            ctx, [a.worker for a in plan.workers], Path(out_dir or f".orch/dry-run/{ctx.layout.run}"), plan=plan
        )
        for path in paths:
            click.echo(str(path))
        click.echo(f"{len(paths)} task file(s) written; nothing launched.")
        missing = say_prerequisites(ctx.spec)
        if missing:  # a script gates a real launch on the dry run's exit status
            from orchestrator.core.errors import OrchError

            raise OrchError(
                f"{len(missing)} prerequisite(s) missing for a real launch: {', '.join(missing)}",
                hint="each `missing` line above says what to do; the task files were written all the same",
            )
        return 0
    launcher = backend_for(ctx)
    found = launch_needed(ctx, launcher, plan)
    if not found.remaining:
        # Machines that would find nothing to claim cost their start-up and earn nothing.
        done = f"all {plan.chunks} chunk(s) have a marker" if plan.chunks else "the run has no chunks"
        click.echo(f"nothing to launch: {done} (orch collect gives the output)")
        return 0
    for worker, job_id in sorted(found.launched.items()):
        click.echo(f"worker {worker}: job {job_id}")
    if found.running:
        click.echo(f"{len(found.running)} worker(s) already running: not launched again.")
    needed = found.needed
    if len(plan.workers) > len(needed):
        click.echo(
            f"{len(plan.workers) - len(needed)} planned worker(s) not launched: {len(found.remaining)} unfinished "
            f"chunk(s) need {len(needed)} (the others' lists are done or empty)."
        )
    if follow:
        return follow_run(ctx, launcher, interval)
    return 0


def say_prerequisites(spec: RunSpec) -> list[str]:
    """What a real launch needs that can be checked from here, each met or what is missing; the
    names of those missing."""
    import os

    from orchestrator.backends.skypilot_checks import prerequisites

    checks = prerequisites(spec, os.environ)
    for check in checks:
        mark = click.style("ok     ", fg="green") if check.ok else click.style("missing", fg="yellow")
        click.echo(f"{mark} {check.name}: {check.detail}")
    missing = [c.name for c in checks if not c.ok]
    if not missing:
        click.echo("every prerequisite met.")
    return missing


@click.command("watch")
@common_options
@backend_option
@click.option("--interval", type=float, default=10.0, show_default=True, help="seconds between checks")
@click.option("--retries", type=int, default=None, help="relaunches per worker (default: the spec's workers.retries)")
@click.option(
    "--deadline",
    default=None,
    metavar="DURATION",
    help="finish within this long of the first launch (8h, 90m, 1.5d): add on-demand workers when "
    "behind schedule (after waiting for spot capacity while the slack allows), retire them when ahead",
)
@click.option("--budget", type=float, default=None, metavar="USD", help="with --deadline: no launch past this cost")
@click.option(
    "--max-on-demand",
    type=int,
    default=None,
    help="with --deadline: extra on-demand workers at most (default: as many as the plan's workers)",
)
@click.option(
    "--restart-overhead",
    type=float,
    default=None,
    metavar="SECONDS",
    help="with --deadline: provision + setup + model load of a new machine (default: as measured on the run, else 600)",
)
@click.option(
    "--randomize",
    is_flag=True,
    help="with --deadline: draw the reserve kept when waiting for spot once for the run, seeded by its name "
    "(a trace cannot be tuned against it; docs/operations.md)",
)
def watch_command(
    inv: Invocation,
    backend: str | None,
    interval: float,
    retries: int | None,
    deadline: str | None,
    budget: float | None,
    max_on_demand: int | None,
    restart_overhead: float | None,
    randomize: bool,
) -> int:
    """Relaunch workers whose jobs end with work left, until every chunk has a marker.

    With --deadline, also keep the run on schedule at the least cost: spot while progress is on
    the uniform line, on-demand workers added when behind (or when the slack left is within a
    restart), retired first when ahead. Behind because spot workers wait for capacity, it first
    waits for spot while the slack exceeds the reserve the zones' learned spells call for.
    Decisions are logged in the store and shown by `orch status`.

    Exits 0 when the run is complete, non-zero when the retry budget is spent with work left.
    """
    from orchestrator.backends import backend_for

    ctx = inv.with_flags(backend=backend).context()
    settings = None
    if budget is not None and deadline is None:
        raise click.BadParameter("--budget goes with --deadline", param_hint="--budget")
    if randomize and deadline is None:
        raise click.BadParameter("--randomize goes with --deadline", param_hint="--randomize")
    if deadline is not None:
        from orchestrator.planning.deadline import DeadlineSettings, parse_duration
        from orchestrator.planning.estimate import RESTART_OVERHEAD_S
        from orchestrator.planning.spot_zones import RESTARTS_FACTOR, draw_restarts_factor
        from orchestrator.planning.startup import measured_startup_s

        if restart_overhead is None:  # the run's own workers' start-up, once any has answered
            restart_overhead = measured_startup_s(ctx.store, ctx.layout) or RESTART_OVERHEAD_S
        settings = DeadlineSettings(
            deadline_s=parse_duration(deadline),
            budget_usd=budget,
            restart_overhead_s=restart_overhead,
            max_on_demand=max_on_demand if max_on_demand is not None else ctx.spec.workers.count,
            commit_margin_s=ctx.spec.workers.lease_ttl + interval,
            restarts_factor=draw_restarts_factor(ctx.layout.run) if randomize else RESTARTS_FACTOR,
        )
    return follow_run(ctx, backend_for(ctx), interval, retries, deadline=settings)


@click.command("resume")
@common_options
@backend_option
@click.option("--follow", is_flag=True, help="then watch until the run is complete")
@click.option("--interval", type=float, default=10.0, show_default=True)
def resume_command(inv: Invocation, backend: str | None, follow: bool, interval: float) -> int:
    """Relaunch just the workers the remaining chunks need, from the markers in the store."""
    from orchestrator.api.lifecycle import resume

    ctx = inv.with_flags(backend=backend).context(model="required")
    resumed = resume(ctx)
    if not resumed.remaining:
        click.echo("every chunk has a marker: nothing to resume (orch collect gives the output)")
        return 0
    said = workers_line(resumed.launched, resumed.running, resumed.launcher.name, attach=follow)
    click.echo(f"{len(resumed.remaining)} chunk(s) left; {said}")
    if follow:
        return follow_run(ctx, resumed.launcher, interval)
    return 0


@click.command("cancel")
@common_options
@backend_option
def cancel_command(inv: Invocation, backend: str | None) -> int:
    """Stop every worker of the run, tracked or not (finished rows are flushed; `orch resume` continues later).

    \b
    1. The jobs record says cancelled (`orch watch` relaunches nothing), and cancel.json in the
       store tells every worker that heartbeats for the run to stop at its next beat, wherever
       it runs and whoever launched it.
    2. The recorded jobs are cancelled through the backend.
    3. What the record does not know is stopped too: local worker processes found by the pid and
       host in their heartbeats; SkyPilot jobs named like the run's workers.
    """
    from orchestrator.fleet.launch import cancel_workers

    ctx = inv.with_flags(backend=backend).context()
    cancelled = cancel_workers(ctx)
    if cancelled.recorded == 0 and not cancelled.strays:
        click.echo("no workers were launched for this run; any that heartbeat for it stop at their next beat")
        return 0
    live, strays = cancelled.live, cancelled.strays
    click.echo(f"cancelled {len(live)} live job(s) of run {ctx.layout.run!r}")
    for stray in strays:
        click.echo(f"stopped {stray}: it worked for the run outside the recorded jobs")
    for job_id in cancelled.orphaned:
        click.echo(
            f"job {job_id}: orphaned record (the backend says RUNNING, its worker has not beaten for a long "
            "time: its controller is gone), not waited on; nothing of the run runs there"
        )
    click.echo("any other worker of the run stops at its next heartbeat (cancel.json in the store)")
    return 0


@click.command("delete")
@common_options
@click.option("--yes", "-y", is_flag=True, help="delete; without it, only say what would be deleted")
@click.option(
    "--force",
    is_flag=True,
    help="delete even a run whose workers are live (they are stopped and waited for first) or whose records "
    "cannot be read",
)
def delete_command(inv: Invocation, yes: bool, force: bool) -> int:
    """Delete a run: every object under its prefix in the store (a directory, S3 or R2) and its
    local workers' logs. It asks nothing: without --yes it says what it would delete and deletes
    nothing (exit 1). It refuses a run whose workers are live (`orch cancel` first) or whose records
    cannot be read, unless --force: then it stops the run's workers as `orch cancel` does and waits
    until none is alive (refusing, with nothing deleted, if one still is), and deletes.
    """
    from orchestrator.core.errors import OrchError, RunNotFound
    from orchestrator.fleet.launch import stop_workers_and_wait
    from orchestrator.runview.runs import delete_run, run_objects

    ctx, damaged = _delete_context(inv)
    run, objects = ctx.layout.run, run_objects(ctx.store, ctx.layout)
    if not objects:
        raise RunNotFound(f"no run {run!r} in {ctx.store.uri}: nothing to delete", hint="`orch runs` lists the runs")
    state = damaged or _live_state(ctx)
    if state is not None and not force:
        first = f"stop its workers first (orch cancel --run {run}), or " if state == "running" else ""
        raise OrchError(
            f"run {run!r} is {state}; nothing deleted",
            hint=f"{first}add --force: it stops every worker that beats for the run, waits for them, then deletes",
            where="delete",
        )
    if not yes:
        then = ", once its workers are stopped" if state is not None else ""
        click.echo(f"would delete {_objects_line(ctx, objects)}{then}")
        raise OrchError(f"run {run!r} not deleted", hint="add --yes to delete it", where="delete")
    if state is not None:  # forced: a live or unreadable run's workers stop before anything goes
        alive = stop_workers_and_wait(ctx)
        if alive:
            raise OrchError(
                f"run {run!r}: {len(alive)} worker(s) still alive after they were told to stop "
                f"({', '.join(alive)}); nothing deleted",
                hint=f"orch status --run {run} shows them; delete again once they stopped",
                where="delete",
            )
        objects = run_objects(ctx.store, ctx.layout)  # with what stopping them wrote (the cancel record)
    delete_run(ctx.store, ctx.spec, objects)
    click.echo(f"deleted run {run!r}: {_objects_line(ctx, objects)}")
    return 0


def _objects_line(ctx: RunContext, objects: list[ObjectInfo]) -> str:
    size = sum(o.size for o in objects)
    return f"{len(objects)} object(s), {size:,} bytes, under {ctx.layout.root} in {ctx.store.uri}"


def _delete_context(inv: Invocation) -> tuple[RunContext, str | None]:
    """The run to delete, and what makes it unreadable (None when it reads): a run whose records are
    damaged is still found (its store and name come from the flags, file and environment)."""
    from orchestrator.core.context import RunContext
    from orchestrator.core.errors import OrchError
    from orchestrator.core.spec_load import load_spec
    from orchestrator.core.store import open_store

    first = load_spec(inv.spec_file, inv.flags)  # the user's own mistakes are theirs to see
    layout = first.layout
    try:
        return inv.context(), None
    except OrchError as e:
        damaged = f"damaged ({e}): whether its workers are live cannot be told"
        return RunContext(first, open_store(first.store, first.store_settings), layout), damaged


def _live_state(ctx: RunContext) -> str | None:
    """'running' when a worker of the run beats or its job is queued, starting or recovering (the
    backend asked, as `orch status` does); the run's word and the workers still going when the run
    reads otherwise (a cancelled run whose worker still drains, or beats on cut off from the
    cancel: it would write into the deleted run); 'damaged (...)' when the run's records cannot be
    read; None otherwise, and for a run never prepared."""
    from orchestrator.core.errors import OrchError, RunNotFound
    from orchestrator.runview.states import GOING
    from orchestrator.runview.status import current_status

    try:
        status = current_status(ctx)
    except RunNotFound:  # objects, but no manifest: a run begun and never prepared has no workers
        return None
    except OrchError as e:  # a record that does not parse: nothing can say whether workers are live
        return f"damaged ({e}): whether its workers are live cannot be told"
    if status.state == "running":
        return "running"
    going = [w.worker for w in status.workers if w.activity in GOING]
    if going:
        return f"{status.state} with {len(going)} worker(s) still going ({', '.join(going)})"
    return None


def register(cli: click.Group) -> None:
    for command in (launch_command, watch_command, resume_command, cancel_command, delete_command):
        cli.add_command(command)

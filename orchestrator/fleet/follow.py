"""Following a run to its end: reconcile until every chunk has a marker, and say why when it stops short."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.backends.base import Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import IncompleteRun
from orchestrator.core.records import read_jobs
from orchestrator.fleet.reconcile import Reconciler, TickReport, watch
from orchestrator.planning.deadline import DeadlineSettings


def follow(
    ctx: RunContext,
    launcher: Launcher,
    interval: float,
    *,
    retries: int | None = None,
    deadline: DeadlineSettings | None = None,
    on_event: Callable[[str], None] = lambda _message: None,
    on_tick: Callable[[TickReport], None] = lambda _report: None,
) -> TickReport:
    """Reconcile every `interval` seconds (relaunching workers whose jobs end with work left) until
    the run is complete or nothing more can be done; the last tick's report."""
    reconciler = Reconciler(ctx, launcher, retries=retries, on_event=on_event, deadline=deadline)
    return watch(reconciler, interval=interval, on_tick=on_tick)


def check_complete(ctx: RunContext, report: TickReport) -> None:
    """IncompleteRun, saying why and what to run next, unless the followed run is complete."""
    if report.complete:
        return
    run, left = ctx.layout.run, report.chunks_total - report.chunks_done
    if report.damaged:
        listed = "\n  ".join(f"{chunk}: {why}" for chunk, why in sorted(report.damaged.items()))
        chunks = " ".join(f"--chunk {chunk}" for chunk in sorted(report.damaged))
        raise IncompleteRun(
            f"run {run!r}: every chunk has a marker, but {len(report.damaged)} are damaged:\n  {listed}",
            hint=f"orch redo --run {run} {chunks}, then orch resume --follow",
        )
    if report.cancelled:
        raise IncompleteRun(
            f"run {run!r} was cancelled with {left} chunk(s) left", hint="orch resume --follow continues it"
        )
    details = "\n  ".join(f"worker {w}: {why}" for w, why in sorted(report.exhausted.items()))
    if report.decision is not None and report.decision.action == "budget":
        details = "\n  ".join(x for x in (details, report.decision.reason) if x)
    raise IncompleteRun(
        f"run {run!r} stopped with {left} chunk(s) left" + (f":\n  {details}" if details else ""),
        hint="see the worker logs (orch status shows the jobs), fix the cause, then `orch resume --follow`",
    )


def live_jobs(ctx: RunContext, launcher: Launcher) -> dict[int, str]:
    """worker -> job id of the run's workers whose jobs are live now."""
    current = {w: a.job_id for w, a in read_jobs(ctx.store, ctx.layout)[0].current_jobs().items()}
    statuses = launcher.statuses(list(current.values())) if current else {}
    return {w: job for w, job in current.items() if job in statuses and statuses[job].state.is_live()}

"""A run from its sources to its output, step by step: the one composition `orch run` and the Python API share.

1. start: prepare the sources (once), plan, launch the workers the unfinished chunks need
   (fleet/start.py); returns at once, the workers going on by themselves. `resume` is step 1 for a
   run prepared before, by any process: the workers its unfinished chunks need, never a second
   copy of a live one.
2. follow_to_end: reconcile until every chunk has a done marker (relaunching workers whose jobs
   end with work left), then a cascade's later stages, each steps 1-2 on a run of its own;
   IncompleteRun, saying why and what to run next, when it stops short.
3. collect_output: the answers into one output in input order, the answer index written, the
   forecast held against what happened.

Every step may be taken again and skips what is done, so a caller that died (a Ctrl-C, a killed
kernel) runs the same steps again to go on. Nothing here prints: progress and events go to the
callbacks the caller gives (the CLI draws them in a terminal, the Python API in a progress bar).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.backends import backend_for
from orchestrator.backends.base import Launcher
from orchestrator.collect.collect import collect
from orchestrator.collect.forecast_actual import ForecastActual, forecast_actual
from orchestrator.collect.report import CollectReport
from orchestrator.core.context import RunContext
from orchestrator.fleet.cascade import run_stages
from orchestrator.fleet.follow import check_complete, follow
from orchestrator.fleet.launch import launch_needed
from orchestrator.fleet.reconcile import TickReport
from orchestrator.fleet.start import StartedRun, start_run
from orchestrator.planning.deadline import DeadlineSettings
from orchestrator.planning.pricing import load_gpu_table
from orchestrator.prepare import PrepareReport, prepare_run
from orchestrator.runview.cascade import check_stage_names

Say = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


@dataclass
class Callbacks:
    """What a caller hears as a run goes: prepare's progress lines, each report, each reconcile tick,
    the fleet's events (a worker relaunched, a deadline decision), and lines worth saying."""

    progress: Say = _quiet
    prepared: Callable[[RunContext, PrepareReport], None] = lambda _ctx, _report: None
    started: Callable[[RunContext, StartedRun], None] = lambda _ctx, _started: None
    tick: Callable[[RunContext, Launcher, TickReport], None] = lambda _ctx, _launcher, _report: None
    event: Say = _quiet
    say: Say = _quiet


def prepare(
    ctx: RunContext, sources: list[str], *, strict: bool = False, check: bool = True, hear: Callbacks | None = None
) -> PrepareReport:
    """Step 1 up to its launch, for a caller that forecasts first (orchestrator.estimate): the
    sources prepared (once) and the spec recorded."""
    hear = hear or Callbacks()
    report = prepare_run(ctx, sources, strict=strict, check=check, progress=hear.progress)
    ctx.freeze()
    hear.prepared(ctx, report)
    return report


def start(
    ctx: RunContext, sources: list[str], *, strict: bool = False, check: bool = True, hear: Callbacks | None = None
) -> StartedRun:
    """Step 1. A cascade's later stages' run names are checked first: one too long is said now,
    not after stage 0 has run."""
    hear = hear or Callbacks()
    if ctx.spec.sweep.cascade:
        check_stage_names(ctx)
    started = start_run(
        ctx,
        sources,
        strict=strict,
        check=check,
        progress=hear.progress,
        on_prepared=lambda report: hear.prepared(ctx, report),
        echo=hear.say,
    )
    hear.started(ctx, started)
    return started


@dataclass
class Resumed:
    """What `resume` found and did."""

    launcher: Launcher
    #: worker -> job id of the workers launched now.
    launched: dict[int, str]
    #: Workers the unfinished chunks need that were running already: not launched again.
    running: list[int]
    #: The chunks without a done marker: none means the run needs no worker.
    remaining: list[str]


def resume(ctx: RunContext) -> Resumed:
    """Step 1 for a run prepared before (`orch resume`, `Run.wait` after `orchestrator.attach`)."""
    launcher = backend_for(ctx)
    found = launch_needed(ctx, launcher, reason="resume")
    return Resumed(launcher, found.launched, found.running, found.remaining)


def follow_to_end(
    ctx: RunContext,
    launcher: Launcher,
    *,
    interval: float,
    check: bool = True,
    retries: int | None = None,
    deadline: DeadlineSettings | None = None,
    later_stages: bool = True,
    hear: Callbacks | None = None,
) -> TickReport:
    """Step 2: the run followed until complete (IncompleteRun otherwise); with `later_stages`, a
    cascade's next stages after it, each started and followed the same way."""
    hear = hear or Callbacks()
    report = follow(
        ctx,
        launcher,
        interval,
        retries=retries,
        deadline=deadline,
        on_event=hear.event,
        on_tick=lambda tick: hear.tick(ctx, launcher, tick),
    )
    check_complete(ctx, report)
    if later_stages and ctx.spec.sweep.cascade:

        def run_stage(stage: RunContext, sources: list[str]) -> None:
            started = start(stage, sources, check=check, hear=hear)
            if started.remaining:
                follow_to_end(stage, started.launcher, interval=interval, check=check, later_stages=False, hear=hear)

        run_stages(ctx, run_stage, hear.say)
    return report


@dataclass
class Collected:
    """What collect_output made: collect's report, and the forecast held against it (when the run
    was forecast and is complete)."""

    report: CollectReport
    forecast: ForecastActual | None


def collect_output(
    ctx: RunContext,
    out: str,
    *,
    fmt: str | None = None,
    retry_out: str | None = None,
    partial: bool = False,
    keep_columns: list[str] | None = None,
    merge_on: str | None = None,
) -> Collected:
    """Step 3: the run's answers into `out` (a file or a table, input order, every custom_id once);
    a complete run's forecast (if it had one) held against what happened, and kept in its record."""
    report = collect(
        ctx.store,
        ctx.layout,
        out,
        fmt=fmt,
        retry_out=retry_out,
        prices=load_gpu_table(),
        default_spot=ctx.spec.resources.spot,
        partial=partial,
        keep_columns=keep_columns,
        merge_on=merge_on,
    )
    return Collected(report, forecast_actual(ctx, report) if report.complete else None)


def describe_actual(actual: ForecastActual) -> str:
    """The forecast against what happened, in one line."""
    return (
        f"forecast vs actual: engine {actual['engine_error']:+.0%} "
        f"({'inside' if actual['inside_band'] else 'outside'} p10-p90, actual {actual['engine_s']:.1f} s), "
        f"output tokens {actual['output_tokens_error']:+.0%}, duration {actual['duration_s']:.0f} s, "
        f"cost ${actual['cost_usd']:,.2f}"
    )


def as_dict(collected: Collected) -> dict[str, Any]:
    """collect's report as `--json` prints it, with the forecast check when there is one."""
    doc = collected.report.to_dict()
    if collected.forecast is not None:
        doc["forecast_vs_actual"] = dict(collected.forecast)
    return doc

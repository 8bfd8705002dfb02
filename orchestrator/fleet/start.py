"""Starting a run: prepare it (once), plan it, launch the workers its unfinished chunks need.

The one composition of those steps: `orch run` calls it before following the run, `orch serve`
for each batch it validated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.backends import backend_for
from orchestrator.backends.base import Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.records import PlanRecord
from orchestrator.fleet.launch import launch_needed
from orchestrator.planning.plan import ensure_plan
from orchestrator.prepare import PrepareReport, prepare_run


@dataclass
class StartedRun:
    """What `start_run` found and did."""

    prepared: PrepareReport
    plan: PlanRecord
    launcher: Launcher
    #: worker -> job id of the workers launched now (live ones are never launched twice).
    launched: dict[int, str]
    #: The chunks without a done marker: none means the run needs no worker.
    remaining: list[str]
    #: Workers the remaining chunks need that were running already (a re-run after Ctrl-C): not
    #: launched again, and followed like the ones launched now.
    running: list[int] = field(default_factory=list)


def start_run(
    ctx: RunContext,
    sources: list[str],
    *,
    strict: bool = False,
    check: bool = True,
    progress: Callable[[str], None] = lambda _line: None,
    on_prepared: Callable[[PrepareReport], None] = lambda _report: None,
    echo: Callable[[str], None] = lambda _line: None,
    at_most_one_worker_per_chunk: bool = False,
) -> StartedRun:
    """Every step may be taken again: each skips what is done.

    1. Prepare the sources (nothing to do when the run was prepared from them), then record the
       spec: a prepare that failed locks nothing. With `check`, a request the workers would refuse
       stops it here, before any chunk is written or any worker launched.
    2. Plan over the spec's workers (fewer, when `at_most_one_worker_per_chunk`, if the chunks
       are fewer), unless a plan for that many exists.
    3. Launch the workers whose lists hold unfinished chunks.
    """
    prepared = prepare_run(ctx, sources, strict=strict, check=check, progress=progress)
    ctx.freeze()
    on_prepared(prepared)
    workers = ctx.spec.workers.count
    if at_most_one_worker_per_chunk:
        workers = max(1, min(workers, prepared.record.chunks))
    plan = ensure_plan(ctx, workers, echo=echo)
    launcher = backend_for(ctx)
    found = launch_needed(ctx, launcher, plan)
    return StartedRun(prepared, plan, launcher, found.launched, found.remaining, found.running)

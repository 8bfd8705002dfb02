"""What the controller asks of the plan: make sure one exists for N workers; which workers are still needed."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.core.context import RunContext
from orchestrator.core.protocol.snapshot import list_done
from orchestrator.core.records import PlanRecord, read_manifest, read_plan
from orchestrator.plan import plan_chunks, write_plan


def ensure_plan(
    ctx: RunContext, workers: int, echo: Callable[[str], None] = lambda _line: None, *, write: bool = True
) -> PlanRecord:
    """The run's plan, made (or remade) when there is none or it was made for another worker count.
    With `write=False` (a dry run) a new plan is only made, not recorded."""
    plan = read_plan(ctx.store, ctx.layout)
    if plan is not None and len(plan.workers) == workers:
        return plan
    plan = plan_chunks(read_manifest(ctx.store, ctx.layout), workers)
    if write:
        write_plan(ctx.store, ctx.layout, plan)
    echo(f"planned {plan.chunks} chunks over {workers} workers" + ("" if write else " (not recorded: dry run)"))
    return plan


def workers_needed(ctx: RunContext) -> tuple[list[int], list[str]]:
    """(workers to launch, unfinished chunks). Workers whose own lists hold unfinished chunks come
    first; if the unfinished chunks are fewer than the workers, fewer workers are enough (the
    others' leftovers are stolen)."""
    plan = read_plan(ctx.store, ctx.layout) or ensure_plan(ctx, ctx.spec.workers.count)
    done = list_done(ctx.store, ctx.layout)
    remaining = [c for a in plan.workers for c in a.chunks if c not in done]
    with_work = [a.worker for a in plan.workers if any(c not in done for c in a.chunks)]
    return with_work[: max(1, min(len(with_work), len(remaining)))] if remaining else [], remaining

"""`orch status` and every other view of a run: its facts read once, its status derived once from them.

1. `gather` (runview/facts.py) reads the manifest, the plan, the jobs and prepare records (4
   GETs), and lists `done/`, `stats/` (each finished chunk's numbers are in its stats key),
   `heartbeats/` (each worker's state is in its key), `leases/`, `decisions/` (plus one GET of the
   latest, if any) and, until every chunk is done, `outputs/` (each part's name carries its row
   count): one request per 1,000 objects. Markers say what is done; stats are a cache of their
   numbers, used only for chunks whose marker exists. A done chunk without a stats entry (a crash
   between the two writes) costs one GET of its marker. A lease no live heartbeat accounts for is
   read, to name a corrupt one. Once every chunk has a marker, every marker is read and the parts
   listed (checkpoints.find_damage): a run is complete only when nothing is damaged. The backend is
   asked for the state of each worker's current job first, before the store is read, so a job it
   reports ended has its markers in the listing.
2. `derive_status` turns those facts into the RunStatus (runview/sections.py): plain data, no I/O,
   each section through one function. The narrow reads share those functions and read only what
   they need (facts.Depth): `cost_so_far` (collect's report, reuse's dollars saved), `sweep_arms`
   (collect's arms table) and `answered_so_far` (serve's batch counts).
3. `to_json` gives it to scripts; docs/operations.md describes every field, generated from the
   types (runview/schema_doc.py). `orch status` shows it (commands/views.py: `status_view`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.base import JobState, JobStatus, Launcher, orphaned
from orchestrator.core import worker_ids
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import is_beating
from orchestrator.core.records import ChunkStats, JobAttempt, read_jobs
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import Store
from orchestrator.planning.pricing import GpuTable, load_gpu_table
from orchestrator.runview.activity import recovery_of, run_state, shown_status, worker_activity
from orchestrator.runview.arms import arms_status
from orchestrator.runview.facts import Depth, RunFacts, gather, read_arm_tallies
from orchestrator.runview.forecast_check import forecast_beside_pace
from orchestrator.runview.models import models_status
from orchestrator.runview.pace import first_launch, overall_pace, run_time_s, timeline
from orchestrator.runview.sections import (
    NOT_LAUNCHED,
    ArmView,
    Chunks,
    Cost,
    CostPerM,
    Estimate,
    Pace,
    PoolEstimate,
    Rows,
    RunStatus,
    Throughput,
    Tokens,
    WorkerView,
)
from orchestrator.runview.tokens import TokenCounts, realised_cost, tokens_of
from orchestrator.runview.words import duration

__all__ = [
    "RunFacts",
    "RunStatus",
    "WorkerView",
    "answered_so_far",
    "cost_so_far",
    "derive_status",
    "finished_of",
    "gather",
    "pace_so_far",
    "rows_in",
    "status_of",
    "sweep_arms",
    "to_json",
]


@dataclass(frozen=True)
class Finished:
    """The chunks whose done marker exists, and their numbers (stats are a cache of the markers:
    only chunks with one count)."""

    done: frozenset[str]
    #: (finished at, stats) of each of them that has stats.
    stats: tuple[tuple[float, ChunkStats], ...]
    rows: int
    errors: int
    tokens: TokenCounts


def finished_of(facts: RunFacts) -> Finished:
    """The run's finished chunks: those of its manifest with a done marker."""
    rows_by_chunk = {e.chunk: e.rows for e in facts.manifest}
    done = frozenset(facts.done & set(rows_by_chunk))
    stats = tuple(pair for chunk, pair in facts.stats.items() if chunk in done)
    return Finished(
        done,
        stats,
        sum(rows_by_chunk[c] for c in done),
        sum(s.errors for _, s in stats),
        tokens_of(s for _, s in stats),
    )


def derive_status(
    facts: RunFacts,
    *,
    now: float,
    prices: GpuTable,
    heartbeat_interval: float = 10.0,
    default_spot: bool = True,
    gpus: Sequence[str] | None = None,
    workers_planned: int | None = None,
    spec: RunSpec | None = None,
) -> RunStatus:
    """The run's status from its facts; `spec` (a run of several models) gives each pool's machines
    to the estimate, and a sweep's arms their pools."""
    finished = finished_of(facts)
    complete = len(finished.done) == len(facts.manifest) and not facts.damaged
    workers = worker_views(facts, finished.done, now=now, heartbeat_interval=heartbeat_interval, complete=complete)
    rows = rows_in(facts, finished, workers)
    working = [v for v in workers if v.chunk]  # a chunk is shown only while the worker beats
    rows_per_s = sum(v.rows_per_s for v in working)
    tokens_per_s = sum(v.tokens_per_s for v in working)
    cost, per_m = costs(workers, finished, prices, default_spot, facts.gpus_of)
    remaining = rows.total - rows.done - rows.in_progress
    eta = remaining / rows_per_s if rows_per_s > 0 and remaining > 0 else (0.0 if remaining <= 0 else None)
    last_finish = max((at for at, _ in finished.stats), default=None)
    models = models_status(facts, set(finished.done), workers, lambda v: _cost_so_far(v, prices, default_spot))
    return RunStatus(
        run=facts.run,
        backend=_backend(facts, spec),
        complete=complete,
        backend_note=facts.backend_note,
        chunks=Chunks(total=len(facts.manifest), done=len(finished.done)),
        rows=rows,
        throughput=Throughput(rows_per_s=round(rows_per_s, 3), tokens_per_s=round(tokens_per_s, 1)),
        eta_s=round(eta, 1) if eta is not None else None,
        cost=cost,
        workers=workers,
        estimate=_estimate(facts, prices, gpus, workers_planned, spec) if gpus else None,
        deadline=facts.decision,
        overall=overall_pace(finished.stats, facts.jobs),
        damaged=dict(facts.damaged),
        corrupt_leases=dict(facts.corrupt_leases),
        tokens=finished.tokens.section(),
        cost_per_m_tokens=per_m,
        forecast=forecast_beside_pace(
            facts.forecast, launched_at=first_launch(facts.jobs), eta_s=eta, now=now, complete=complete
        ),
        timeline=timeline(sorted(at for at, _ in finished.stats), facts.jobs),
        state=run_state(
            complete=complete,
            damaged=bool(facts.damaged),
            cancelled=facts.jobs.cancelled,
            activities=[w.activity for w in workers],
            launched=bool(facts.jobs.workers or facts.heartbeats),
        ),
        prepared_at=facts.prepared_at,
        model=facts.model,
        input=facts.input,
        run_time_s=run_time_s(facts.jobs, now=now, finished_at=last_finish if complete else None),
        models=models,
        arms=arms_status(spec, facts.arm_tallies, models, cost.so_far_usd) if spec is not None else {},
        cascade=list(facts.stages),
    )


def _backend(facts: RunFacts, spec: RunSpec | None) -> str | None:
    """The backend that launched the run's workers (its jobs record's, else its latest launch's);
    workers that beat with no launch recorded (a probe's, or started by hand) run on the spec's
    backend, not on none."""
    launched = [a.backend for w in facts.jobs.workers.values() for a in w.attempts]
    if facts.jobs.backend is not None or launched or not facts.heartbeats:
        return facts.jobs.backend or (launched[-1] if launched else None)
    return spec.backend if spec is not None else facts.spec_backend


def rows_in(facts: RunFacts, finished: Finished, workers: Sequence[WorkerView], pool: str | None = None) -> Rows:
    """Rows by how far they got: in finished chunks, checkpointed in unfinished ones (both kept
    whatever happens: `done`), and answered in a live worker's memory, not yet saved (`in_progress`).
    `pool`: a run of several models' rows of that model only (the deadline policy's, pool by pool)."""
    rows_by_chunk = {e.chunk: e.rows for e in facts.manifest if pool is None or e.model == pool}
    total = sum(rows_by_chunk.values())
    done = finished.done & set(rows_by_chunk)
    finished_rows = sum(rows_by_chunk[c] for c in done)
    saved = sum(min(n, rows_by_chunk[c]) for c, n in facts.checkpointed.items() if c in rows_by_chunk and c not in done)
    # A flush between a heartbeat and the listing counts its rows twice until the next beat: capped.
    unsaved = sum(v.rows_unsaved for v in workers if pool is None or v.chunk in rows_by_chunk)
    unsaved = min(unsaved, total - finished_rows - saved)
    errors = sum(s.errors for c, (_, s) in facts.stats.items() if c in done)
    return Rows(
        total=total,
        done=finished_rows + saved,
        in_progress=unsaved,
        finished=finished_rows,
        checkpointed=saved,
        errors=errors,
        set_aside=facts.set_aside if pool is None else 0,
        reused=facts.reused if pool is None else 0,
    )


def worker_views(
    facts: RunFacts, done: frozenset[str], *, now: float, heartbeat_interval: float, complete: bool
) -> list[WorkerView]:
    """A row per worker: planned, launched or heartbeating. Live figures (chunk, rates) come only
    from a heartbeat that is still beating; totals from the last heartbeat whatever its age."""
    finished_by: dict[str, int] = {}
    for chunk, (_, s) in facts.stats.items():
        if chunk in done:  # stats are a cache of the markers
            finished_by[s.worker] = finished_by.get(s.worker, 0) + 1
    own = {str(a.worker): a.chunks for a in (facts.plan.workers if facts.plan else [])}
    current = {str(w): a for w, a in facts.jobs.current_jobs().items()}
    # A recovery is a relaunch after a job ended with work left, not a launch after `orch cancel`.
    recoveries = {
        w: sum(1 for a in wj.attempts if a.reason.startswith("relaunch")) for w, wj in facts.jobs.workers.items()
    }
    views = []
    for name in sorted(set(own) | set(current) | set(facts.heartbeats), key=worker_ids.sort_key):
        base = worker_ids.job_worker(name)
        attempt = current.get(name) or current.get(base)
        hb = facts.heartbeats.get(name)
        status = shown_status(facts.statuses.get(attempt.job_id) if attempt else None, hb, complete=complete)
        age = now - hb.updated_at if hb else None
        # A job the backend says ended has no live process, whatever its last heartbeat's age.
        ended = status is not None and status.state.is_terminal()
        beating = hb is not None and not ended and is_beating(hb, now=now, heartbeat_interval=heartbeat_interval)
        live = hb if beating else None
        activity, activity_s = worker_activity(
            hb, live, status, attempt, now=now, interval=heartbeat_interval, cancelled=facts.jobs.cancelled
        )
        views.append(
            WorkerView(
                worker=name,
                state=(status.state if status else JobState.UNKNOWN) if attempt else NOT_LAUNCHED,
                job_id=attempt.job_id if attempt else None,
                recovery_count=(status.recovery_count if status else 0) + max(recoveries.get(base, 0), 0),
                recovery=recovery_of(status, hb, now=now, interval=heartbeat_interval),
                accelerator=(hb.accelerator if hb else None) or (status.accelerator if status else None),
                cloud=(hb.cloud if hb else None) or (status.cloud if status else None),
                region=(hb.region if hb else None) or (status.region if status else None),
                spot=hb.spot if hb is not None and hb.spot is not None else (status.spot if status else None),
                chunk=live.chunk if live else None,
                chunk_rows=live.chunk_rows if live else 0,
                chunk_rows_done=live.chunk_rows_done if live else 0,
                rows_saved=live.rows_saved if live else 0,
                rows_unsaved=live.rows_unsaved if live else 0,
                chunks_assigned=len(own.get(name, ())),
                chunks_done_of_own_list=sum(1 for c in own.get(name, ()) if c in done),
                chunks_finished=finished_by.get(name, 0),
                rows_done=hb.rows_done if hb else 0,
                tokens_per_s=live.tokens_per_s if live else 0.0,
                rows_per_s=live.rows_per_s if live else 0.0,
                heartbeat_state=hb.state if hb else None,
                heartbeat_age_s=round(age, 1) if age is not None else None,
                uptime_s=round(hb.uptime_s, 1) if hb else 0.0,
                failure_reason=_failure(status, attempt, hb.updated_at if hb else None, now=now),
                log=status.log if status else None,
                activity=activity,
                activity_s=activity_s,
                clock_offset_s=hb.clock_offset_s if hb else None,
            )
        )
    return views


def costs(
    workers: Sequence[WorkerView],
    finished: Finished,
    prices: GpuTable,
    default_spot: bool,
    gpus_of: Callable[[str], float],
) -> tuple[Cost, CostPerM]:
    """The money so far (the status's `cost`) and what it bought: $ per million tokens, spot and
    on-demand apart. Each worker's process pays for the GPUs `gpus_of` it (its machine's share)."""
    by_worker = {}
    for v in workers:
        usd = _cost_so_far(v, prices, default_spot)
        by_worker[v.worker] = (usd * gpus_of(v.worker) if usd else 0.0, v.spot if v.spot is not None else default_spot)
    per_m = realised_cost((s for _, s in finished.stats), by_worker)
    cost = Cost(
        so_far_usd=round(sum(usd for usd, _ in by_worker.values()), 2),
        worker_hours=round(sum(v.uptime_s for v in workers) / 3600, 3),
        spot_usd=round(per_m.spot.usd, 2),
        on_demand_usd=round(per_m.on_demand.usd, 2),
    )
    return cost, per_m


def _cost_so_far(view: WorkerView, prices: GpuTable, default_spot: bool) -> float:
    """The worker's machine time at one of its GPUs' price (spot or on-demand as it runs); 0 for a
    GPU the price table does not know."""
    gpu = prices.find(view.accelerator)
    if gpu is None:
        return 0.0
    spot = view.spot if view.spot is not None else default_spot
    return view.uptime_s / 3600 * gpu.price(spot, view.cloud)


def _failure(
    status: JobStatus | None, attempt: JobAttempt | None, last_beat: float | None, *, now: float
) -> str | None:
    """Why the worker's current job failed: the backend's word, else what the controller recorded;
    or that the backend's record of it is orphaned (says RUNNING, nothing runs)."""
    if status is not None and orphaned(status, last_beat, now=now):
        silent = f"no heartbeat for {duration(now - last_beat)}" if last_beat is not None else "no heartbeat ever"
        return (
            f"job {status.job_id}'s record is orphaned: {status.state.value} for "
            f"{duration(now - (status.running_since or status.started_at or now))}, {silent} (its controller "
            "is gone, e.g. the API server restarted); `orch cancel` does not wait on it"
        )
    if status is None or not status.state.value.startswith("FAILED"):
        return None
    return status.failure_reason or (attempt.failure_reason if attempt else None) or status.state.value


def _estimate(
    facts: RunFacts, prices: GpuTable, gpus: Sequence[str], workers: int | None, spec: RunSpec | None
) -> Estimate | None:
    """The fleet's time and cost for what is left; a run of several models: its pools' (the
    slowest pool's time, the pools' costs summed, each pool under `pools`). Workers of the local
    backend run on this machine, not on the spec's GPUs: their estimate waits for what they measure."""
    from orchestrator.planning.estimate import estimate
    from orchestrator.planning.pool_estimate import estimate_pools, pool_fleets

    if _backend(facts, spec) == "local":
        measured = {s.accelerator for _, s in facts.stats.values() if s.accelerator}
        if not measured:
            return None
        priced = [gpu.name for gpu in map(prices.find, sorted(measured)) if gpu is not None]
        gpus = priced or gpus
    try:
        est = estimate(
            prices.per_machine(facts.machine_gpus_of(None)),
            gpus,
            workers or max(len(facts.plan.workers) if facts.plan else 1, 1),
            facts.manifest,
            facts.stats,
            facts.done,
        )
        fleets = pool_fleets(spec, facts.plan, facts.manifest) if spec is not None else {}
        pools = estimate_pools(prices, fleets, facts.manifest, facts.stats, facts.done)
    except Exception:  # an unknown GPU name in the spec: the status itself must still show
        return None
    f = est.fleet
    own = Estimate(
        gpu=f.gpu,
        workers=est.workers,
        tokens_per_s_per_worker=f.tokens_per_s,
        measured=f.measured,
        basis=f.basis,
        spot_hours=f.spot_hours,
        spot_usd=f.spot_usd,
        on_demand_hours=f.on_demand_hours,
        on_demand_usd=f.on_demand_usd,
    )
    if pools is None:
        return own
    slow = pools.slowest  # the run's machine and speed are its slowest pool's, not a blend of the pools'
    whole = pools.to_dict()
    return own.model_copy(
        update={
            "gpu": slow.gpu,
            "tokens_per_s_per_worker": slow.tokens_per_s,
            "basis": slow.basis,
            "measured": slow.measured,
            "workers": sum(p.workers for p in pools.pools),
            "spot_hours": whole["spot_hours"],
            "spot_usd": whole["spot_usd"],
            "on_demand_hours": whole["on_demand_hours"],
            "on_demand_usd": whole["on_demand_usd"],
            "slowest_pool": whole["slowest_pool"],
            "pools": {name: PoolEstimate(**p) for name, p in whole["pools"].items()},
        }
    )


def to_json(status: RunStatus) -> dict[str, Any]:
    """`orch status --json`: the status as plain JSON values (its fields: docs/operations.md)."""
    return status.model_dump(mode="json")


def status_of(
    store: Store,
    layout: RunLayout,
    launcher: Launcher | None,
    *,
    now: float,
    prices: GpuTable,
    heartbeat_interval: float = 10.0,
    default_spot: bool = True,
    gpus: Sequence[str] | None = None,
    workers_planned: int | None = None,
    spec: RunSpec | None = None,
) -> RunStatus:
    """The whole status: `gather`, then `derive_status`."""
    return derive_status(
        gather(store, layout, launcher, spec),
        now=now,
        prices=prices,
        heartbeat_interval=heartbeat_interval,
        default_spot=default_spot,
        gpus=gpus,
        workers_planned=workers_planned,
        spec=spec,
    )


def current_status(ctx: RunContext, prices_path: str | None = None, launcher: Launcher | None = None) -> RunStatus:
    """The run's status, asking the backend that launched its workers (if any did)."""
    from orchestrator.backends import backend_for

    if launcher is None:
        record, _ = read_jobs(ctx.store, ctx.layout)
        launcher = backend_for(ctx, record.backend) if record.backend else None
    return status_of(
        ctx.store,
        ctx.layout,
        launcher,
        now=time.time(),
        prices=load_gpu_table(prices_path),
        heartbeat_interval=ctx.spec.workers.heartbeat_interval,
        default_spot=ctx.spec.resources.spot,
        gpus=ctx.spec.resources.gpus,
        workers_planned=ctx.spec.workers.count,
        spec=ctx.spec,
    )


# -- narrow reads: one number, read as deep as it needs and derived by the functions above ---------


def cost_so_far(
    store: Store,
    layout: RunLayout,
    *,
    prices: GpuTable,
    default_spot: bool = True,
    spec: RunSpec | None = None,
    now: float | None = None,
) -> tuple[Cost, CostPerM]:
    """The run's cost so far and what it bought, as its status counts them, from the store alone
    (the workers' heartbeats; no backend asked, no damage checked): collect's report and reuse's
    dollars saved."""
    facts = gather(store, layout, None, spec, depth=Depth.WORKERS)
    finished = finished_of(facts)
    workers = worker_views(facts, finished.done, now=now or time.time(), heartbeat_interval=10.0, complete=False)
    return costs(workers, finished, prices, default_spot, facts.gpus_of)


def sweep_arms(
    store: Store, layout: RunLayout, spec: RunSpec, *, prices: GpuTable, default_spot: bool = True
) -> dict[str, ArmView]:
    """A sweep's arms as its status counts them (each arm's rows and tokens from its finished
    chunks' answers, its share of its pool's cost): collect's arms table. Empty without a sweep."""
    if not spec.sweep.arms:
        return {}
    facts = gather(store, layout, None, spec, depth=Depth.WORKERS)
    finished = finished_of(facts)
    workers = worker_views(facts, finished.done, now=time.time(), heartbeat_interval=10.0, complete=False)
    cost, _ = costs(workers, finished, prices, default_spot, facts.gpus_of)
    models = models_status(facts, set(finished.done), workers, lambda v: _cost_so_far(v, prices, default_spot))
    return arms_status(spec, read_arm_tallies(store, layout, facts, spec), models, cost.so_far_usd)


def pace_so_far(store: Store, layout: RunLayout) -> Pace | None:
    """The finished chunks' pace as its status says it (`overall`): collect's forecast check."""
    facts = gather(store, layout, depth=Depth.WORKERS)
    return overall_pace(finished_of(facts).stats, facts.jobs)


@dataclass(frozen=True)
class Answered:
    """What a run has answered so far, by the rule of its status: rows of chunks with a done
    marker, their error rows and tokens, and the rows prepare set aside and answered by reuse."""

    rows: int
    errors: int
    set_aside: int
    reused: int
    tokens: Tokens


def answered_so_far(store: Store, layout: RunLayout) -> Answered:
    """Serve's batch counts (Depth.CHUNKS: two GETs and the done and stats listings)."""
    facts = gather(store, layout, depth=Depth.CHUNKS)
    finished = finished_of(facts)
    return Answered(finished.rows, finished.errors, facts.set_aside, facts.reused, finished.tokens.section())

"""`orch status`: one view of a run, from a handful of requests: listings, never one request per chunk.

1. `gather` (runview/facts.py) reads the manifest, the plan, the jobs and prepare records (4
   GETs), and lists `done/`, `stats/` (each finished chunk's numbers are in its stats key),
   `heartbeats/` (each worker's state is in its key), `leases/`, `decisions/` (plus one GET of the
   latest, if any) and, until every chunk is done, `outputs/` (each part's name carries its row
   count): one request per 1,000 objects. Markers say what is done; stats are a cache of their
   numbers, used only for chunks whose marker exists. A done chunk without a stats entry (a crash
   between the two writes) costs one GET of its marker. A lease no live heartbeat accounts for is
   read, to name a corrupt one. Once every chunk has a marker, every marker is read and the parts
   listed (checkpoints.find_damage): a run is complete only when nothing is damaged. The backend is
   asked for the state of each worker's current job.
2. `derive_status` turns those facts into the view: plain data, no I/O.
3. `to_json` gives it to scripts; `orch status` shows it (commands/views.py: `status_view`).

JSON shape (stable for scripts):
    run, backend, complete (bool: every chunk has a marker, and none is damaged), backend_note (str|null),
    state (the run in a word: runview/activity.py), prepared_at (when prepare finished) | null,
    model, input (the frozen model and what was prepared, for `orch runs`; null in `orch status`),
    damaged: {chunk: what is wrong} (corrupt markers, parts that do not match them; `orch redo` each),
    corrupt_leases: {key: what is wrong} (treated as expired once older than the lease TTL),
    chunks: {total, done},
    rows: {total, done (kept whatever happens: finished + checkpointed), finished (in finished chunks),
           checkpointed (in parts of unfinished chunks), in_progress (answered, held in live workers'
           memory until their next checkpoint: their heartbeats' rows_unsaved), errors (error rows in
           finished chunks), set_aside (input rows prepare set aside: not in total; collect answers
           them with error lines), reused (input rows answered by earlier runs, --reuse-from: not in
           total; collect writes their answers)},
    timeline: [[unix time, chunks done], ...] (the first launch at 0, then finished chunks; at most
              pace.TIMELINE_POINTS points, the last one exact),
    throughput: {rows_per_s, tokens_per_s} (sum over running workers), eta_s (null when unknown),
    overall: {wall_s, rows_per_s, tokens_per_s} | null (the finished chunks' pace, from the first
             launch, or the first chunk's start without one, to the last chunk's end, less the time
             the run sat cancelled),
    run_time_s: from the first launch to now (to the last chunk's end once complete), less the time
                the run sat cancelled (between `orch cancel` and the launch that resumed it) | null,
    cost: {so_far_usd, worker_hours, spot_usd, on_demand_usd} (per-GPU-hour prices x workers' uptime,
          restarts included),
    tokens: {prompt_tokens, cached_tokens (prompt tokens the engines' prefix caches held),
             generated_tokens} (in finished chunks),
    cost_per_m_tokens: {all, spot, on_demand: {usd, prompt_tokens, cached_tokens, generated_tokens,
                        usd_per_m_tokens, usd_per_m_generated}} (orchestrator/runview/tokens.py),
    workers: [{worker, state (its job's, as the backend says; SUCCEEDED once its heartbeat said it
               exited 0, WINDING_DOWN for a job still running under a complete run: activity.shown_status),
               job_id, recovery_count, accelerator, cloud, region, spot, chunk, chunk_rows, chunk_rows_done,
               rows_saved, rows_unsaved (rows of its chunks in hand checkpointed, and answered in memory:
               while it beats), chunks_assigned, chunks_done_of_own_list, chunks_finished
               (by this worker, from any list), rows_done, tokens_per_s, rows_per_s, heartbeat_state,
               heartbeat_age_s, uptime_s, failure_reason (why its current job failed) | null,
               log (its log file, or the command that shows it) | null, activity (what it does, in words:
               runview/activity.py), activity_s (how long: loading since its process started, silent since
               its last heartbeat) | null, clock_offset_s (its clock minus the store's, as its heartbeat
               measured: core/protocol/clocks.py) | null}],
    estimate: {gpu, workers, tokens_per_s_per_worker, measured, basis (which speed, in words), spot_hours,
               spot_usd, on_demand_hours, on_demand_usd} | null (what is left, on the fleet any_of picks, or
               on what the run measured where the price table has no price: a local cpu;
               orchestrator/planning/estimate.py),
    deadline: the deadline policy's latest decision | null ({at, deadline_s, budget_usd, action,
              mode, reason, launch, retire, elapsed_s, progress, line, need_rows_per_s,
              have_rows_per_s, slack_s, speed}; orchestrator/planning/deadline.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
from orchestrator.runview.activity import run_state, shown_status, worker_activity
from orchestrator.runview.facts import RunFacts, gather
from orchestrator.runview.forecast_check import forecast_beside_pace
from orchestrator.runview.models import models_status
from orchestrator.runview.pace import first_launch, overall_pace, run_time_s, timeline
from orchestrator.runview.tokens import realised_cost, tokens_of

__all__ = ["RunFacts", "RunStatus", "WorkerView", "derive_status", "gather", "status_of", "to_json"]


@dataclass
class WorkerView:
    worker: str
    state: str
    job_id: str | None = None
    recovery_count: int = 0
    accelerator: str | None = None
    cloud: str | None = None
    region: str | None = None
    spot: bool | None = None
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0
    #: Rows of its chunks in hand checkpointed, and answered but held in memory (live workers only).
    rows_saved: int = 0
    rows_unsaved: int = 0
    chunks_assigned: int = 0
    chunks_done_of_own_list: int = 0
    chunks_finished: int = 0
    rows_done: int = 0
    tokens_per_s: float = 0.0
    rows_per_s: float = 0.0
    heartbeat_state: str | None = None
    heartbeat_age_s: float | None = None
    uptime_s: float = 0.0
    #: Why the current job failed (a local worker's: its exit and its log's last error line).
    failure_reason: str | None = None
    #: Where the current job's log is: a file, or the command that shows it.
    log: str | None = None
    #: What the worker does, in words (runview/activity.py): from its heartbeat while it beats,
    #: else from its job's state.
    activity: str = "not launched"
    #: How long it has been at it, where that is known: loading (since its process started), or
    #: silent (since its last heartbeat).
    activity_s: float | None = None
    #: Its clock minus the store's, as its last heartbeat measured (core/protocol/clocks.py).
    clock_offset_s: float | None = None


@dataclass
class RunStatus:
    run: str
    backend: str | None
    complete: bool
    backend_note: str | None
    chunks: dict[str, int]
    rows: dict[str, int]
    throughput: dict[str, float]
    eta_s: float | None
    cost: dict[str, float]
    workers: list[WorkerView]
    #: What is left, on the fleet any_of would pick (`orch plan --estimate`'s fleet line); None
    #: when no GPU candidates were given.
    estimate: dict[str, Any] | None = None
    #: The deadline policy's latest decision, with its reason and numbers.
    deadline: dict[str, Any] | None = None
    #: The finished chunks' pace: what a complete run shows instead of live throughput.
    overall: dict[str, float] | None = None
    #: chunk -> what is wrong with its marker or parts: the run is not complete until redone.
    damaged: dict[str, str] = field(default_factory=dict)
    #: lease key -> what is wrong with it.
    corrupt_leases: dict[str, str] = field(default_factory=dict)
    #: Prompt, cached and generated tokens of the finished chunks.
    tokens: dict[str, int] = field(default_factory=dict)
    #: The realised $ per million tokens, for all workers and for spot and on-demand ones apart.
    cost_per_m_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: [unix time, chunks done] from the first launch to the latest finished chunk (for a chart).
    timeline: list[list[float]] = field(default_factory=list)
    #: The run as a whole, in a word (RUN_STATES).
    state: str = "prepared"
    #: When prepare finished (`orch runs` shows the run's age), None when not known.
    prepared_at: float | None = None
    #: The model the run froze (None until a command named one) and its input, in a few words:
    #: what `orch runs` shows beside each run (filled by runview/runs.py's list_runs).
    model: str | None = None
    input: str | None = None
    #: From the first launch to now (to the last chunk's end once complete), less the time the run
    #: sat cancelled (runview/pace.py); None before any launch.
    run_time_s: float | None = None
    #: A run of several models: each model's chunks, rows, tokens, workers and cost (runview/models.py).
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: A sweep: each arm's rows, errors, tokens and its share of its pool's cost (runview/arms.py).
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: A cascade: a row per stage, its rows answered and escalated (fleet/cascade.py).
    cascade: list[dict[str, Any]] = field(default_factory=list)
    #: The forecast's duration band beside the pace's projected finish (runview/forecast_check.py).
    forecast: dict[str, Any] | None = None


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
    """The run's status from its facts; `spec` (a run of several models) gives each pool's machines to the estimate."""
    rows_by_chunk = {e.chunk: e.rows for e in facts.manifest}
    done = facts.done & set(rows_by_chunk)
    complete = len(done) == len(rows_by_chunk) and not facts.damaged
    errors = sum(s.errors for c, (_, s) in facts.stats.items() if c in done)
    workers = _worker_views(facts, done, now=now, heartbeat_interval=heartbeat_interval, complete=complete)
    rows = _rows(facts, rows_by_chunk, done, workers)
    working = [v for v in workers if v.chunk]  # a chunk is shown only while the worker beats
    rows_per_s = sum(v.rows_per_s for v in working)
    tokens_per_s = sum(v.tokens_per_s for v in working)
    finished = [s for c, (_, s) in facts.stats.items() if c in done]
    cost, per_m = _costs(workers, finished, prices, default_spot, facts.gpus_of)
    remaining = rows["total"] - rows["done"] - rows["in_progress"]
    eta = remaining / rows_per_s if rows_per_s > 0 and remaining > 0 else (0.0 if remaining <= 0 else None)
    last_finish = max((at for c, (at, _) in facts.stats.items() if c in done), default=None)
    return RunStatus(
        run=facts.run,
        backend=facts.jobs.backend,
        complete=complete,
        backend_note=facts.backend_note,
        chunks={"total": len(rows_by_chunk), "done": len(done)},
        rows={**rows, "errors": errors, "set_aside": facts.set_aside, "reused": facts.reused},
        throughput={"rows_per_s": round(rows_per_s, 3), "tokens_per_s": round(tokens_per_s, 1)},
        eta_s=round(eta, 1) if eta is not None else None,
        cost=cost,
        workers=workers,
        estimate=_estimate(facts, prices, gpus, workers_planned, spec) if gpus else None,
        deadline=facts.decision.model_dump() if facts.decision is not None else None,
        overall=overall_pace([s for c, s in facts.stats.items() if c in done], facts.jobs),
        damaged=dict(facts.damaged),
        corrupt_leases=dict(facts.corrupt_leases),
        tokens=tokens_of(finished).to_dict(),
        cost_per_m_tokens=per_m,
        forecast=forecast_beside_pace(
            facts.forecast, launched_at=first_launch(facts.jobs), eta_s=eta, now=now, complete=complete
        ),
        timeline=timeline(sorted(at for c, (at, _) in facts.stats.items() if c in done), facts.jobs),
        state=run_state(
            complete=complete,
            damaged=bool(facts.damaged),
            cancelled=facts.jobs.cancelled,
            activities=[w.activity for w in workers],
            launched=bool(facts.jobs.workers or facts.heartbeats),
        ),
        prepared_at=facts.prepared_at,
        run_time_s=run_time_s(facts.jobs, now=now, finished_at=last_finish if complete else None),
        models=models_status(facts, done, workers, lambda v: _cost_so_far(v, prices, default_spot)),
    )


def _rows(facts: RunFacts, rows_by_chunk: dict[str, int], done: set[str], workers: list[WorkerView]) -> dict[str, int]:
    """Rows by how far they got: in finished chunks, checkpointed in unfinished ones (both kept
    whatever happens: `done`), and answered in a live worker's memory, not yet saved (`in_progress`)."""
    total = sum(rows_by_chunk.values())
    finished = sum(rows_by_chunk[c] for c in done)
    saved = sum(min(n, rows_by_chunk[c]) for c, n in facts.checkpointed.items() if c in rows_by_chunk and c not in done)
    # A flush between a heartbeat and the listing counts its rows twice until the next beat: capped.
    unsaved = min(sum(v.rows_unsaved for v in workers), total - finished - saved)
    return {
        "total": total,
        "done": finished + saved,
        "in_progress": unsaved,
        "finished": finished,
        "checkpointed": saved,
    }


def _worker_views(
    facts: RunFacts, done: set[str], *, now: float, heartbeat_interval: float, complete: bool
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
        views.append(
            WorkerView(
                worker=name,
                state=(status.state.value if status else JobState.UNKNOWN.value) if attempt else "NOT LAUNCHED",
                job_id=attempt.job_id if attempt else None,
                recovery_count=(status.recovery_count if status else 0) + max(recoveries.get(base, 0), 0),
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
                clock_offset_s=hb.clock_offset_s if hb else None,
            )
        )
        view = views[-1]
        view.activity, view.activity_s = worker_activity(
            hb, live, status, attempt, now=now, interval=heartbeat_interval, cancelled=facts.jobs.cancelled
        )
    return views


def _costs(
    workers: list[WorkerView],
    finished: list[ChunkStats],
    prices: GpuTable,
    default_spot: bool,
    gpus_of: Callable[[str], float],
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """The money so far (the status's `cost`) and what it bought: $ per million tokens, spot and
    on-demand apart. Each worker's process pays for the GPUs `gpus_of` it (its machine's share)."""
    by_worker = {}
    for v in workers:
        usd = _cost_so_far(v, prices, default_spot)
        by_worker[v.worker] = (usd * gpus_of(v.worker) if usd else 0.0, v.spot if v.spot is not None else default_spot)
    per_m = realised_cost(finished, by_worker)
    cost = {
        "so_far_usd": round(sum(usd for usd, _ in by_worker.values()), 2),
        "worker_hours": round(sum(v.uptime_s for v in workers) / 3600, 3),
        "spot_usd": round(per_m["spot"]["usd"], 2),
        "on_demand_usd": round(per_m["on_demand"]["usd"], 2),
    }
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
) -> dict[str, Any] | None:
    """The fleet's time and cost for what is left; a run of several models: its pools' (the
    slowest pool's time, the pools' costs summed, each pool under `pools`)."""
    from orchestrator.planning.estimate import estimate
    from orchestrator.planning.pool_estimate import estimate_pools, pool_fleets

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
    own = {
        "gpu": f.gpu,
        "workers": est.workers,
        "tokens_per_s_per_worker": f.tokens_per_s,
        "measured": f.measured,
        "basis": f.basis,
        "spot_hours": f.spot_hours,
        "spot_usd": f.spot_usd,
        "on_demand_hours": f.on_demand_hours,
        "on_demand_usd": f.on_demand_usd,
    }
    if pools is None:
        return own
    slow = pools.slowest  # the run's machine and speed are its slowest pool's, not a blend of the pools'
    by_pool = {"gpu": slow.gpu, "tokens_per_s_per_worker": slow.tokens_per_s, "basis": slow.basis}
    by_pool |= {"measured": slow.measured, "workers": sum(p.workers for p in pools.pools)}
    return {**own, **by_pool, **pools.to_dict()}


def duration(seconds: float | None, exact: bool = False) -> str:
    """How a status says a duration (the terminal's and the web page's): 45s, 12m, 3h05m; `exact` keeps
    the seconds under two hours (`2m10s`: a wait that moves)."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120 and not (exact and seconds >= 60):
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s" if exact else f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def duration_band(p10: float, p50: float, p90: float) -> str:
    """A forecast's duration band, `p50 (p10-p90)`, to the second under two hours: rounded to
    minutes, a band of 2m10s-2m50s reads 2m-2m."""
    return f"{duration(p50, exact=True)} ({duration(p10, exact=True)}-{duration(p90, exact=True)})"


def to_json(status: RunStatus) -> dict[str, Any]:
    return asdict(status)


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
    facts = gather(store, layout, launcher, spec)
    status = derive_status(
        facts,
        now=now,
        prices=prices,
        heartbeat_interval=heartbeat_interval,
        default_spot=default_spot,
        gpus=gpus,
        workers_planned=workers_planned,
        spec=spec,
    )
    if spec is not None and spec.sweep.arms:
        from orchestrator.runview.arms import arms_status

        finished = (facts.manifest, facts.done & {e.chunk for e in facts.manifest})
        status.arms = arms_status(store, layout, spec, finished, status.models, status.cost["so_far_usd"])
    if spec is not None and spec.sweep.cascade:
        from orchestrator.runview.cascade import stages_status

        status.cascade = stages_status(store, layout, spec.sweep.cascade)
    return status


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

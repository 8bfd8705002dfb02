"""The deadline policy in the reconcile loop: read the run, decide (planning/deadline.py), act, log.

Each round:
1. The run's facts as `orch status` reads them (listings), the jobs record and the backend's states.
2. The fleet's state: rows done (finished chunks + rows done in chunks being worked on), the rate
   of the spot workers that are up (measured rows/s from heartbeats; the estimate while a worker
   loads its model), the spot workers waiting for capacity (pending past a start-up, recovering)
   and the fleet's pace once they are back, the on-demand workers this policy launched, the cost
   so far, and the zones' ranking (planning/zone_steering.py): its learned up spells set the
   reserve that waiting for spot keeps back.
3. `decide`; then launch on-demand workers (new worker numbers beyond the plan: they own no list
   and take untouched chunks from the most loaded lists) through the same `launch_workers` as
   every launch, with use_spot=False, or retire some (cancel: SIGTERM, so they flush and give
   their leases back).
4. Log every launch, retirement, budget stop and change of mode (a wait for spot among them) under
   decisions/ in the store, with its reason and the zone ranking's first zone; `orch status` shows
   the latest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.backends.base import JobState, JobStatus, Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.pools import run_models
from orchestrator.core.records import (
    ChunkStats,
    DecisionRecord,
    JobAttempt,
    JobsRecord,
    ManifestEntry,
    ZoneHistory,
    update_jobs,
)
from orchestrator.core.spec import RunSpec
from orchestrator.fleet.launch import launch_workers
from orchestrator.planning.deadline import DeadlineSettings, Decision, FleetState, OnDemandWorker, decide
from orchestrator.planning.estimate import throughput
from orchestrator.planning.pricing import GpuTable, load_gpu_table
from orchestrator.planning.zone_steering import RankedZone, describe, earlier_histories, learned_up_s, zone_order
from orchestrator.runview.status import RunFacts, RunStatus, derive_status, finished_of, gather, rows_in

Event = Callable[[str], None]


@dataclass
class _Spot:
    """The spot workers (or the spec's choice) as the policy counts them."""

    up_rate: float = 0.0  # rows/s of those up, or starting on capacity found lately
    waiting: int = 0  # waiting for capacity: pending past a start-up, or recovering from a preemption
    pace: float = 0.0  # rows/s of all of them: the fleet's pace once spot is back

    def add(self, attempt: JobAttempt, job: JobStatus, rate: float, now: float, settings: DeadlineSettings) -> None:
        starting = (
            job.state in (JobState.PENDING, JobState.STARTING)
            and now - attempt.launched_at <= 2 * settings.restart_overhead_s
        )
        if job.state is JobState.RUNNING or starting:
            self.up_rate += rate
        elif job.state in (JobState.PENDING, JobState.STARTING, JobState.RECOVERING):
            self.waiting += 1
        self.pace += rate


def _pools(facts: RunFacts) -> list[str | None]:
    """The pools decided for: each model's of a run of several models (the manifest's order), else the run."""
    models = list(dict.fromkeys(e.model for e in facts.manifest if e.model))
    return [*models] if models else [None]


def _lateness(decision: Decision) -> float:
    """How far a pool is from the rate it needs (lower: later): what it has over what it needs."""
    return decision.have_rows_per_s / decision.need_rows_per_s if decision.need_rows_per_s > 0 else float("inf")


@dataclass
class _Scope:
    """What one decision counts: the whole run, or one pool's chunks, machines and workers."""

    gpus: Sequence[str]
    entries: list[ManifestEntry]
    stats: Mapping[str, tuple[float, ChunkStats]]
    workers: set[int]
    total_rows: int
    done_rows: int  # finished, checkpointed, and answered in a live worker's memory

    @classmethod
    def of(cls, spec: RunSpec, facts: RunFacts, status: RunStatus, record: JobsRecord, pool: str | None) -> _Scope:
        everyone = {w.worker for w in record.workers.values()}
        if pool is None:
            done = status.rows.done + status.rows.in_progress
            return cls(spec.resources.gpus, list(facts.manifest), facts.stats, everyone, status.rows.total, done)
        model = run_models(spec).get(pool)
        gpus = (model.resources if model is not None and model.resources else spec.resources).gpus
        entries = [e for e in facts.manifest if e.model == pool]
        planned = {a.worker for a in facts.plan.workers if a.model == pool} if facts.plan else set()
        # Workers outside the plan (on-demand ones) count for the pool they were launched for.
        extra = {w.worker for w in record.workers.values() if any(a.pool == pool for a in w.attempts)}
        rows = rows_in(facts, finished_of(facts), status.workers, pool)  # as status counts the run's
        chunks = {e.chunk for e in entries}
        stats = {c: s for c, s in facts.stats.items() if c in chunks}
        return cls(gpus, entries, stats, planned | extra, rows.total, rows.done + rows.in_progress)


class DeadlineControl:
    def __init__(
        self,
        ctx: RunContext,
        launcher: Launcher,
        settings: DeadlineSettings,
        *,
        prices: GpuTable | None = None,
        clock: Callable[[], float] = time.time,
        env: Mapping[str, str] | None = None,
        on_event: Event = lambda _message: None,
    ):
        self.ctx = ctx
        self.launcher = launcher
        self.settings = settings
        self.prices = prices or load_gpu_table()
        self.clock = clock
        self.env = env
        self.on_event = on_event
        self._last_mode: dict[str | None, str] = {}  # pool -> the mode last decided
        self._earlier: list[ZoneHistory] | None = None  # other runs' zone histories: read once

    def zones(self, now: float) -> list[RankedZone]:
        """The spec's zones ranked now (this run's history read each round, earlier runs' once)."""
        if not self.ctx.spec.resources.zones:
            return []
        if self._earlier is None:
            self._earlier = earlier_histories(self.ctx)
        return zone_order(self.ctx, now, self._earlier)

    def round(self, statuses: Mapping[str, JobStatus]) -> Decision:
        """One round; a run of several models decides pool by pool (each its own work and speed,
        the one deadline) and returns the decision of the pool furthest from the rate it needs."""
        store, layout, spec = self.ctx.store, self.ctx.layout, self.ctx.spec
        facts = gather(store, layout, None, spec)
        facts.statuses = dict(statuses)
        now = self.clock()
        status = derive_status(
            facts,
            now=now,
            prices=self.prices,
            heartbeat_interval=spec.workers.heartbeat_interval,
            default_spot=spec.resources.spot,
        )
        order = self.zones(now)
        record = facts.jobs
        first = max([int(w) for w in record.workers] + [len(facts.plan.workers) - 1 if facts.plan else -1]) + 1
        decisions = []
        for pool in _pools(facts):
            state, jobs = self.fleet_state(status, record, statuses, facts, now, pool)
            state = replace(state, mean_up_s=learned_up_s(self.ctx, now, order))
            decision = decide(state, self.settings)
            decision.speed, decision.zone, decision.pool = state.new_worker_speed, describe(order), pool
            if pool is not None:
                decision.reason = f"pool {pool}: {decision.reason}"
            first += self.act(decision, jobs, first, order)
            decisions.append(decision)
        return min(decisions, key=_lateness)

    def act(self, decision: Decision, jobs: Mapping[int, str], first: int, order: list[RankedZone]) -> int:
        """Launch (workers numbered from `first`, in the decision's pool) or retire what the decision
        says, and log it; the worker numbers used."""
        asked = decision.launch
        if asked:
            launched = launch_workers(
                self.ctx,
                self.launcher,
                range(first, first + decision.launch),
                reason=f"deadline: {decision.mode}",
                use_spot=False,
                env=self.env,
                clock=self.clock,
                zones=[z.place for z in order],
                pool=decision.pool,
            )
            decision.launch = len(launched)
            for w, job in sorted(launched.items()):
                self.on_event(f"worker {w}: on-demand job {job} ({decision.reason})")
        if decision.retire:
            self.retire({w: jobs[w] for w in decision.retire}, decision.reason)
        if decision.action != "hold" or decision.mode != self._last_mode.get(decision.pool):
            self.log(decision)
        self._last_mode[decision.pool] = decision.mode
        return asked

    def fleet_state(
        self,
        status: RunStatus,
        record: JobsRecord,
        statuses: Mapping[str, JobStatus],
        facts: RunFacts,
        now: float,
        pool: str | None = None,
    ) -> tuple[FleetState, dict[int, str]]:
        """The fleet as `decide` sees it: the whole run's, or in a run of several models `pool`'s
        (its chunks, its finished chunks' speed on its machines, its workers)."""
        scope = _Scope.of(self.ctx.spec, facts, status, record, pool)
        tp = throughput(self.prices, scope.gpus, scope.entries, scope.stats)
        # A new on-demand worker: what any_of picks on demand, the cheapest per hour.
        # On a machine the price table does not know (a local run's cpu), a new worker is another
        # of those, at the speed they measured.
        pick = (
            max(tp.unpriced, key=lambda g: tp.measured[g])
            if tp.unpriced
            else min(scope.gpus, key=lambda g: self.prices.get(g).on_demand_usd_h)
        )
        per_row = max(tp.tokens_per_row, 1e-9)
        new_rate = tp.tokens_per_s[pick] / per_row
        views = {w.worker: w for w in status.workers}
        spot, on_demand, jobs = _Spot(), [], {}
        for worker, attempt in record.current_jobs().items():
            job = statuses.get(attempt.job_id)
            if attempt.retired or job is None or not job.state.is_live() or worker not in scope.workers:
                continue
            view = views.get(str(worker))
            measured = view.rows_per_s if view is not None and view.rows_per_s > 0 else None
            if attempt.use_spot is False:
                jobs[worker] = attempt.job_id
                on_demand.append(OnDemandWorker(worker, measured or new_rate, job.state is JobState.RUNNING))
                continue
            speed = tp.speed_of(view.accelerator if view else None, self.prices)
            spot.add(attempt, job, measured or (speed / per_row if speed is not None else new_rate), now, self.settings)
        started = min((a.launched_at for wj in record.workers.values() for a in wj.attempts), default=now)
        unfinished = [e for e in scope.entries if e.chunk not in facts.done]
        in_hand = {w.chunk for w in status.workers if w.chunk}
        state = FleetState(
            elapsed_s=now - started,
            total_rows=float(scope.total_rows),
            done_rows=float(scope.done_rows),
            spot_rate=spot.up_rate,
            spot_waiting=spot.waiting,
            spot_pace=spot.pace,
            on_demand=on_demand,
            new_worker_rate=new_rate,
            new_worker_usd_h=0.0
            if pick in tp.unpriced
            else self.prices.get(pick).on_demand_usd_h * facts.machine_gpus_of(pool),
            new_worker_speed=f"a new worker on {pick}: {tp.basis(pick)}",
            cost_so_far_usd=status.cost.so_far_usd,
            largest_chunk_rows=float(max((e.rows for e in unfinished), default=0)),
            open_chunks=sum(1 for e in unfinished if e.chunk not in in_hand),
        )
        return state, jobs

    def retire(self, jobs: Mapping[int, str], reason: str) -> None:
        def change(rec: JobsRecord) -> None:
            for worker, job_id in jobs.items():
                attempt = rec.worker(worker).current
                if attempt is not None and attempt.job_id == job_id:
                    attempt.retired = True

        # Recorded first: a cancelled job of ours is not a reason to relaunch it.
        update_jobs(self.ctx.store, self.ctx.layout, change)
        self.launcher.cancel(list(jobs.values()))
        for worker, job_id in sorted(jobs.items()):
            self.on_event(f"worker {worker}: on-demand job {job_id} retired ({reason})")

    def log(self, decision: Decision) -> None:
        now = self.clock()
        record = DecisionRecord(
            at=now, deadline_s=self.settings.deadline_s, budget_usd=self.settings.budget_usd, **decision.to_dict()
        )
        self.ctx.store.put(self.ctx.layout.decision(now), record.to_bytes())
        where = f" ({decision.zone})" if decision.zone else ""
        self.on_event(f"deadline [{decision.mode}] {decision.action}: {decision.reason}{where}")

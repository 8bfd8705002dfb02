"""The deadline policy in the reconcile loop: read the run, decide (controller/deadline.py), act, log.

Each round:
1. The run's facts as `orch status` reads them (listings), the jobs record and the backend's states.
2. The fleet's state: rows done (finished chunks + rows done in chunks being worked on), the rate
   of the spot workers that are up (measured rows/s from heartbeats; the estimate while a worker
   loads its model), the on-demand workers this policy launched, the cost so far.
3. `decide`; then launch on-demand workers (new worker numbers beyond the plan: they own no list
   and take untouched chunks from the most loaded lists) through the same `launch_workers` as
   every launch, with use_spot=False, or retire some (cancel: SIGTERM, so they flush and give
   their leases back).
4. Log every launch, retirement, budget stop and change of mode under decisions/ in the store,
   with its reason; `orch status` shows the latest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from orchestrator.backends.base import JobState, JobStatus, Launcher
from orchestrator.controller.deadline import DeadlineSettings, Decision, FleetState, OnDemandWorker, decide
from orchestrator.controller.estimate import throughput
from orchestrator.controller.launch import launch_workers
from orchestrator.controller.pricing import GpuTable, load_gpu_table
from orchestrator.controller.status import RunFacts, RunStatus, derive_status, gather
from orchestrator.controller.zone_steering import describe, zone_order
from orchestrator.core.context import RunContext
from orchestrator.core.records import DecisionRecord, JobsRecord, update_jobs

Event = Callable[[str], None]


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
        self._last_mode: str | None = None

    def round(self, statuses: Mapping[str, JobStatus]) -> Decision:
        store, layout, spec = self.ctx.store, self.ctx.layout, self.ctx.spec
        facts = gather(store, layout, None)
        facts.statuses = dict(statuses)
        now = self.clock()
        status = derive_status(
            facts,
            now=now,
            prices=self.prices,
            heartbeat_interval=spec.workers.heartbeat_interval,
            default_spot=spec.resources.spot,
        )
        record = facts.jobs
        state, jobs = self.fleet_state(status, record, statuses, facts, now)
        decision = decide(state, self.settings)
        decision.speed = state.new_worker_speed
        if decision.launch:
            first = max([int(w) for w in record.workers] + [len(facts.plan.workers) - 1 if facts.plan else -1]) + 1
            workers = list(range(first, first + decision.launch))
            order = zone_order(self.ctx, now)
            decision.zone = describe(order)
            launched = launch_workers(
                self.ctx,
                self.launcher,
                workers,
                reason=f"deadline: {decision.mode}",
                use_spot=False,
                env=self.env,
                clock=self.clock,
                zones=[z.place for z in order],
            )
            decision.launch = len(launched)
            for w, job in sorted(launched.items()):
                self.on_event(f"worker {w}: on-demand job {job} ({decision.reason})")
        if decision.retire:
            self.retire({w: jobs[w] for w in decision.retire}, decision.reason)
        if decision.action != "hold" or decision.mode != self._last_mode:
            self.log(decision)
        self._last_mode = decision.mode
        return decision

    def fleet_state(
        self, status: RunStatus, record: JobsRecord, statuses: Mapping[str, JobStatus], facts: RunFacts, now: float
    ) -> tuple[FleetState, dict[int, str]]:
        spec = self.ctx.spec
        tp = throughput(self.prices, spec.resources.gpus, facts.manifest, facts.stats)
        # A new on-demand worker: what any_of picks on demand, the cheapest per hour.
        # On a machine the price table does not know (a local run's cpu), a new worker is another
        # of those, at the speed they measured.
        pick = (
            max(tp.unpriced, key=lambda g: tp.measured[g])
            if tp.unpriced
            else min(spec.resources.gpus, key=lambda g: self.prices.get(g).on_demand_usd_h)
        )
        per_row = max(tp.tokens_per_row, 1e-9)
        new_rate = tp.tokens_per_s[pick] / per_row
        views = {w.worker: w for w in status.workers}
        spot_rate, on_demand, jobs = 0.0, [], {}
        for worker, attempt in record.current_jobs().items():
            job = statuses.get(attempt.job_id)
            if attempt.retired or job is None or not job.state.is_live():
                continue
            view = views.get(str(worker))
            measured = view.rows_per_s if view is not None and view.rows_per_s > 0 else None
            if attempt.use_spot is False:
                jobs[worker] = attempt.job_id
                on_demand.append(OnDemandWorker(worker, measured or new_rate, job.state is JobState.RUNNING))
                continue
            # Spot (or the spec's choice): counted when up, or starting on capacity found lately.
            starting = (
                job.state in (JobState.PENDING, JobState.STARTING)
                and now - attempt.launched_at <= 2 * self.settings.restart_overhead_s
            )
            if job.state is JobState.RUNNING or starting:
                speed = tp.speed_of(view.accelerator if view else None, self.prices)
                spot_rate += measured or (speed / per_row if speed is not None else new_rate)
        started = min((a.launched_at for wj in record.workers.values() for a in wj.attempts), default=now)
        unfinished = [e for e in facts.manifest if e.chunk not in facts.done]
        in_hand = {w.chunk for w in status.workers if w.chunk}
        state = FleetState(
            elapsed_s=now - started,
            total_rows=float(status.rows["total"]),
            done_rows=float(status.rows["done"] + status.rows["in_progress"]),
            spot_rate=spot_rate,
            on_demand=on_demand,
            new_worker_rate=new_rate,
            new_worker_usd_h=0.0 if pick in tp.unpriced else self.prices.get(pick).on_demand_usd_h,
            new_worker_speed=f"a new worker on {pick}: {tp.basis(pick)}",
            cost_so_far_usd=status.cost["so_far_usd"],
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

"""The reconcile loop behind `orch watch`: keep workers running until every chunk has a marker.

SkyPilot recovers a preempted managed job by itself (RECOVERING); this loop handles the rest.
Each tick:
1. Ask the backend about each worker's current job, before the store is read: a job it reports
   ended wrote its markers before it ended, so step 2 sees them (read the other way round, a
   worker that finished the last chunk between the two reads looked SUCCEEDED with that chunk
   left, and was relaunched for it).
2. Count markers (one listing). Every chunk has one: the run is complete, once every marker is
   read and its parts match it (checkpoints.find_damage); damaged chunks stop the loop, named,
   for `orch redo`. Record the jobs that ended.
3. Relaunch a worker whose job ended with work left: FAILED*, CANCELLED by someone other than
   `orch cancel`, gone from the backend, or SUCCEEDED while chunks nobody holds remain (unless
   another process of that worker id still heartbeats). Each worker has a retry budget; a worker
   that exited because the store stayed unreachable past its outage budget (exit 75) is
   relaunched without spending it. Relaunches go through the same launcher as every launch.
4. When no worker is live, none may be relaunched, and chunks remain: give up (exit non-zero).
After 2, where the backend says where jobs run (SkyPilot), each spot job's zone, preemptions
and time to capacity go into the run's zones.json (planning/zone_history.py); relaunches try the
spec's zones in the order that history ranks them (planning/zone_steering.py), said with the reason.
With a deadline (`orch watch --deadline`), step 3 is preceded by the deadline policy's round
(fleet/deadline_control.py): on-demand workers added or retired, and a budget that, once
reached, stops every launch.

`watch` waits out a store that does not answer (or is full) as it waits out a backend that
cannot be asked: it says so, tries again with backoff, and gives up only after
`store_settings.watch_outage_budget` seconds. Between ticks it waits `interval` after a tick in
which something changed, and longer after each quiet one (PollPace): SkyPilot's API server, which
every tick asks, is asked less while jobs are starting or running undisturbed, and least when it
answers slowly or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.backends.base import JobState, JobStatus, Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import BackendError, CorruptRecord, LaunchFailed
from orchestrator.core.exits import WorkerExit
from orchestrator.core.protocol.checkpoints import find_damage
from orchestrator.core.protocol.heartbeats import is_beating, read_heartbeats
from orchestrator.core.protocol.leases import read_lease
from orchestrator.core.protocol.outage import Outage
from orchestrator.core.protocol.snapshot import RunSnapshot, take_snapshot
from orchestrator.core.records import JobAttempt, JobsRecord, read_jobs, read_manifest, update_jobs
from orchestrator.core.store import StoreFull, StoreUnavailable
from orchestrator.fleet.deadline_control import DeadlineControl
from orchestrator.fleet.launch import current_statuses, launch_workers
from orchestrator.planning.deadline import DeadlineSettings, Decision
from orchestrator.planning.pricing import GpuTable
from orchestrator.planning.zone_history import place_of, record_zones
from orchestrator.planning.zone_steering import describe, zone_order

Event = Callable[[str], None]


@dataclass
class TickReport:
    chunks_total: int
    chunks_done: int
    live: int = 0
    #: Unfinished chunks under a lease that has not expired yet: claimable later, even with no worker live.
    pending_leases: int = 0
    relaunched: dict[int, str] = field(default_factory=dict)
    exhausted: dict[int, str] = field(default_factory=dict)
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    #: chunk -> what is wrong with its marker or parts (checked once every chunk has a marker).
    damaged: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.chunks_done >= self.chunks_total and not self.damaged

    cancelled: bool = False
    #: Set when the backend could not be asked this round (the loop waits and asks again).
    unreachable: str | None = None
    #: The deadline policy's decision this round (with --deadline).
    decision: Decision | None = None

    @property
    def stuck(self) -> bool:
        """Nothing runs, nothing was relaunched, no lease is about to free a chunk, and work is left."""
        return (
            not self.complete
            and self.live == 0
            and not self.relaunched
            and not self.pending_leases
            and self.unreachable is None
        )


class Reconciler:
    def __init__(
        self,
        ctx: RunContext,
        launcher: Launcher,
        *,
        clock: Callable[[], float] = time.time,
        retries: int | None = None,
        env: Mapping[str, str] | None = None,
        on_event: Event = lambda _message: None,
        deadline: DeadlineSettings | None = None,
        prices: GpuTable | None = None,
    ):
        self.ctx = ctx
        self.launcher = launcher
        self.clock = clock
        self.retries = ctx.spec.workers.retries if retries is None else retries
        self.env = env
        self.on_event = on_event
        self.deadline = (
            DeadlineControl(ctx, launcher, deadline, prices=prices, clock=clock, env=env, on_event=on_event)
            if deadline is not None
            else None
        )
        self._manifest: list[str] | None = None
        self._zones_seen = False

    @property
    def _chunks(self) -> list[str]:
        """The run's chunks, read at the first tick (a store that is down then is waited out too)."""
        if self._manifest is None:
            self._manifest = [e.chunk for e in read_manifest(self.ctx.store, self.ctx.layout)]
        return self._manifest

    def tick(self) -> TickReport:
        self.ctx.store.check_space()  # a full disk is waited out like an outage (`watch`), and said
        chunks = self._chunks
        record, _ = read_jobs(self.ctx.store, self.ctx.layout)
        current = record.current_jobs()
        # Step 1 before step 2: the module docstring says why.
        unreachable: str | None = None
        try:
            statuses = current_statuses(self.ctx, self.launcher, current, self.clock()) if current else {}
        except BackendError as e:
            statuses, unreachable = {}, str(e)
        snapshot = take_snapshot(self.ctx.store, self.ctx.layout)
        report = TickReport(chunks_total=len(chunks), chunks_done=len(snapshot.done & set(chunks)))
        if report.chunks_done >= report.chunks_total:
            report.damaged = find_damage(self.ctx.store, self.ctx.layout, chunks)
            if report.damaged:
                return report  # a person decides: `orch redo` the damaged chunks
        report.cancelled = record.cancelled
        if unreachable is not None:
            # Not knowing is not "gone": relaunching now could duplicate live workers. Wait.
            report.unreachable = unreachable
            self.on_event(f"backend unreachable, nothing relaunched this round: {unreachable}")
            return report
        report.statuses = statuses
        ended = {
            w: report.statuses[a.job_id]
            for w, a in current.items()
            if a.ended_state is None and a.job_id in report.statuses and report.statuses[a.job_id].state.is_terminal()
        }
        if ended:
            self._record_ends(ended)
        if self._zones_seen or any(place_of(s) for s in report.statuses.values()):
            self._zones_seen = True  # a backend that says where jobs run (SkyPilot): keep zones.json
            for event in record_zones(self.ctx, current, report.statuses, self.clock()):
                self.on_event(event)
        report.live = sum(
            1 for a in current.values() if a.job_id in report.statuses and report.statuses[a.job_id].state.is_live()
        )
        if report.complete or record.cancelled:
            return report  # after `orch cancel`, nothing comes back until `orch resume`
        claimable, held = self._claimable(snapshot, check_leases=report.live == 0)
        report.pending_leases = held if report.live == 0 else 0
        if self.deadline is not None:
            report.decision = self.deadline.round(report.statuses)
            if report.decision.action == "budget":
                return report  # the budget stops every launch, relaunches included
        wanted = self._wanted(current, record, report, claimable_left=len(claimable))
        if wanted:
            report.relaunched = self._relaunch(wanted)
        return report

    def _wanted(
        self, current: Mapping[int, JobAttempt], record: JobsRecord, report: TickReport, *, claimable_left: int
    ) -> dict[int, tuple[str, bool]]:
        """Step 3: the workers to relaunch, each with (reason, counted against the retry budget)."""
        wanted: dict[int, tuple[str, bool]] = {}
        beating: set[str] | None = None
        for worker, attempt in sorted(current.items()):
            status = report.statuses.get(attempt.job_id)
            state = status.state if status else JobState.UNKNOWN
            if state.is_live() or attempt.retired:
                continue
            if status is not None and status.exit_code == WorkerExit.STORE_UNREACHABLE:
                # The store was down longer than the worker waited: start it again, for free.
                wanted[worker] = ("relaunch after a store outage (not counted)", False)
                continue
            reason = self._relaunch_reason(state, claimable_left=claimable_left - len(wanted))
            if reason is None:
                continue
            if state is JobState.SUCCEEDED:
                beating = self._beating() if beating is None else beating
                if str(worker) in beating:
                    continue  # another process of this worker id is at work (an untracked twin)
            if record.worker(worker).relaunches >= self.retries:
                detail = (status.failure_reason if status else None) or state.value
                report.exhausted[worker] = f"{self.retries} relaunches spent; last job {attempt.job_id}: {detail}"
                continue
            wanted[worker] = (reason, True)
        return wanted

    def _beating(self) -> set[str]:
        """Worker ids with a heartbeat that is fresh and not an exit."""
        now, interval = self.clock(), self.ctx.spec.workers.heartbeat_interval
        return {
            w
            for w, hb in read_heartbeats(self.ctx.store, self.ctx.layout).items()
            if is_beating(hb, now=now, heartbeat_interval=interval)
        }

    def _claimable(self, snapshot: RunSnapshot, *, check_leases: bool) -> tuple[list[str], int]:
        """Unfinished chunks nobody holds, and how many are held. The listing's write times say
        which leases may be alive; with no worker live, those few are read to be sure (a lease
        given back on SIGTERM is free at once)."""
        ttl, now = self.ctx.spec.workers.lease_ttl, self.clock()
        claimable, held = [], 0
        for chunk in self._chunks:
            if chunk in snapshot.done:
                continue
            written = snapshot.lease_written.get(chunk)
            if written is None or now - written > ttl:
                claimable.append(chunk)
                continue
            if check_leases and self._lease_free(chunk, now):
                claimable.append(chunk)
                continue
            held += 1
        return claimable, held

    def _lease_free(self, chunk: str, now: float) -> bool:
        try:
            lease = read_lease(self.ctx.store, self.ctx.layout, chunk)
        except CorruptRecord:
            return False  # garbage, and younger than the TTL (older ones were free already): held
        return lease is None or lease[0].is_free(now)

    def _relaunch_reason(self, state: JobState, claimable_left: int) -> str | None:
        if state is JobState.SUCCEEDED:
            # It found nothing to claim when it exited; relaunch only for chunks nobody holds now.
            return "relaunch: chunks left that nobody holds" if claimable_left > 0 else None
        if state is JobState.CANCELLED:
            return "relaunch after CANCELLED (not by orch cancel)"
        return f"relaunch after {state.value}"

    def _relaunch(self, wanted: dict[int, tuple[str, bool]]) -> dict[int, str]:
        """Relaunch workers, grouped by reason; (reason, counted against the retry budget)."""
        done: dict[int, str] = {}
        order = zone_order(self.ctx, self.clock())  # the zones as they rank now, for every relaunch
        where = f" ({describe(order)})" if order else ""
        for reason, counted in sorted(set(wanted.values())):
            workers = [w for w, why in wanted.items() if why == (reason, counted)]
            try:
                launched = launch_workers(
                    self.ctx,
                    self.launcher,
                    workers,
                    reason=reason,
                    count_as_relaunch=counted,
                    env=self.env,
                    clock=self.clock,
                    zones=[z.place for z in order],
                )
            except LaunchFailed as e:
                launched = e.launched
                for w, why in e.failures.items():
                    self.on_event(f"worker {w}: relaunch failed: {why}")
            for w, job_id in launched.items():
                done[w] = reason
                self.on_event(f"worker {w}: {reason} -> job {job_id}{where}")
        return done

    def _record_ends(self, ended: Mapping[int, JobStatus]) -> None:
        now = self.clock()

        def change(rec: JobsRecord) -> None:
            for worker, status in ended.items():
                attempt = rec.worker(worker).current
                if attempt is not None and attempt.job_id == status.job_id and attempt.ended_state is None:
                    attempt.ended_state = status.state.value
                    attempt.ended_at = status.ended_at or now
                    attempt.failure_reason = status.failure_reason

        update_jobs(self.ctx.store, self.ctx.layout, change)
        for worker, status in sorted(ended.items()):
            detail = f" ({status.failure_reason})" if status.failure_reason else ""
            self.on_event(f"worker {worker}: job {status.job_id} ended {status.state.value}{detail}")


class PollPace:
    """The wait before `watch`'s next tick: `interval` after a tick that changed something (a job's
    state, a finished chunk, a relaunch), 1.5x longer after each quiet tick, up to 6x `interval`
    and never past 60 s (unless `interval` itself is longer). A backend that could not be asked
    counts as quiet: a saturated API server gets fewer questions, not more."""

    GROWTH = 1.5
    MOST_FACTOR = 6.0
    MOST_S = 60.0

    def __init__(self, interval: float):
        self.interval = interval
        self.most = max(interval, min(interval * self.MOST_FACTOR, self.MOST_S))
        self.wait = interval
        self._seen: tuple[object, ...] | None = None

    def next_wait(self, report: TickReport) -> float:
        seen = (
            report.chunks_done,
            tuple(sorted((job, s.state.value, s.recovery_count) for job, s in report.statuses.items())),
        )
        changed = report.unreachable is None and (bool(report.relaunched) or seen != self._seen)
        self.wait = self.interval if changed else min(self.most, self.wait * self.GROWTH)
        if report.unreachable is None:
            self._seen = seen
        return self.wait


def watch(
    reconciler: Reconciler,
    *,
    interval: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    on_tick: Callable[[TickReport], None] = lambda _report: None,
    max_ticks: int | None = None,
) -> TickReport:
    """Tick until the run is complete, stuck or damaged. Returns the last report.

    A store that does not answer is waited out (see the module docstring); OutageTooLong when it
    stays down past the budget."""
    outage = Outage(reconciler.ctx.spec.store_settings.watch_outage_budget)
    pace = PollPace(interval)
    ticks = 0
    while True:
        try:
            report = reconciler.tick()
            on_tick(report)  # the live view reads the store too
        except StoreUnavailable as e:
            if outage.failed(e):
                what = "store full" if isinstance(e, StoreFull) else "store unreachable"
                reconciler.on_event(
                    f"{what} ({e}); nothing relaunched meanwhile; workers keep their finished rows; "
                    f"waiting up to {outage.budget_s:g}s for it"
                )
            outage.check_budget("orch watch")
            sleep(min(max(outage.pause_s(), 0.5), interval))
            continue
        lasted = outage.recovered()
        if lasted is not None:
            reconciler.on_event(f"store reachable again after {lasted:.0f}s")
        ticks += 1
        done = report.complete or report.stuck or report.cancelled or bool(report.damaged)
        if done or (max_ticks is not None and ticks >= max_ticks):
            return report
        sleep(pace.next_wait(report))

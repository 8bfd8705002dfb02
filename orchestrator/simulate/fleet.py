"""The simulated fleet: workers whose every scheduling decision is a call into orch's protocol, on a virtual clock.

Each simulated worker follows worker/runner.py's procedure with the production objects —
`ChunkClaimer` (own list, stealing, expired leases, rescue), `acquire`/`LeaseKeeper` (leases),
`ChunkJob` (resume from parts, checkpoints, the create-if-absent done marker) and
`HeartbeatPublisher` — over a `MemoryStore` whose clock is the simulation's. Only the engine is
simulated: a chunk's rows take rows / speed seconds.

What is simulated when, and why that is exact:
- Lease renewals fall every lease_ttl / 3 of each busy worker's time, and are written when they
  become observable. Before the end game, a live holder's lease is never taken (it is renewed in
  time; rescues and takeovers of expired leases come only in the end game), so a renewal is seen
  only by whoever reads that lease: a worker reaching a chunk a thief holds, or the holder itself
  (a flush, its chunk's end, its preemption). The store tells the fleet before any lease is read
  (LeaseReadStore), and the holder's last renewal due by then is written, stamped with its own
  time: what the reader sees is what a renewal every lease_ttl / 3 would have left. From the end
  game on (leases listed, live holders' leases taken), each renewal is a real event. Heartbeats
  are read only by the rescue step, which runs only in the end game: they are published from
  then on.
- Checkpoints: a chunk's parts are read only by whoever resumes the chunk next. Before the end of
  the run (while untouched chunks remain), that is its own holder after a preemption, or a worker
  taking over an expired lease, and both happen after the holder's preemption. So flushes are
  written when they become observable: at a preemption, one part with the rows done by the last
  checkpoint boundary (written as of that boundary), and at completion, one part with the rest.
  Once no untouched chunk is left (the end game: rescues of live chunks become possible), every
  busy worker checkpoints on a real event every checkpoint_interval, and the event finds out as a
  real flush would whether its lease was taken over (the flush renews the lease first, and fails
  then). The part itself, and the renewal that goes with it, are written when they become
  observable: before anyone reads that chunk's lease (a rescuer reads it before it takes the
  chunk over and resumes from its parts), stamped with the checkpoint's own time, as one part
  with every unit flushed since the last one written. A listing of every lease reads only their
  times, and a live holder's renewal events (every lease_ttl / 3) keep its lease within a TTL
  either way. So what anyone can read is the same as with a flush every interval all along, in
  fewer parts.
- A simulated chunk has `units` rows, each standing for rows/units real rows, sized so that a unit
  takes at most half a checkpoint interval on the fastest GPU.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import heapq
import itertools
import math
import random
from collections.abc import Iterator, Sequence

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.checkpoints import ChunkJob
from orchestrator.core.protocol.claims import ChunkClaimer, PlanIndex, RunView
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import LeaseLost
from orchestrator.core.records import Heartbeat, ManifestEntry
from orchestrator.planning.deadline import DeadlineSettings, Decision, FleetState, OnDemandWorker, decide
from orchestrator.planning.pricing import GpuTable
from orchestrator.planning.spot_zones import PRIOR_UP_S, ZoneModel
from orchestrator.planning.zone_steering import rank_zones
from orchestrator.simulate.config import SimConfig
from orchestrator.simulate.fleet_zones import FleetZones
from orchestrator.simulate.policies import Policy
from orchestrator.simulate.results import FleetResult, Segment
from orchestrator.simulate.sim_worker import (
    LeaseReadStore,
    Session,
    SimClock,
    SimLeaseKeeper,
    SimWorker,
    UnitCodec,
    prefix_speedup,
    unit_rows,
)
from orchestrator.simulate.traces import Trace


def _measured_rate(w: SimWorker) -> float | None:
    """A worker's speed once it has finished a chunk (what the real worker knows of itself)."""
    return w.rate if w.chunks_done else None


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The event loop makes almost no reference cycles, but the collector would scan the heap it
    builds (every object of the run's store) again and again: 11 of 90 s at 100,000 chunks."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Fleet:
    def __init__(
        self,
        config: SimConfig,
        policy: Policy,
        entries: Sequence[ManifestEntry],
        gpus: Sequence[str],
        trace: Trace,
        prices: GpuTable,
        seed: int,
        deadline: DeadlineSettings | None = None,
    ):
        self.config = config
        self.deadline = deadline
        self.prices = prices
        self.rng = random.Random(seed * 31 + 7)
        self.done_units = 0
        self.done: set[str] = set()
        self.decisions: list[Decision] = []
        self.on_demand_launched = 0
        self.policy = policy
        self.seed = seed
        self.trace = trace
        self.clock = SimClock()
        self.layout = RunLayout("sim")
        self.store = LeaseReadStore(
            self.clock, f"sim-{policy.name}-{seed}", self.layout.leases_prefix, self._lease_read
        )
        #: Who holds each chunk being worked on, for the renewals due when its lease is read.
        self.holders: dict[str, SimWorker] = {}
        self.entries = {e.chunk: e for e in entries}
        speeds = [config.base_rows_per_s * prices.get(g).relative_speed for g in gpus]
        # A unit takes at most half a checkpoint interval on the fastest GPU.
        self.rows_per_unit = max(1, int(max(speeds) * config.checkpoint_interval_s / 2))
        self.units = {e.chunk: max(1, math.ceil(e.rows / self.rows_per_unit)) for e in entries}
        self.workers = [
            SimWorker(i, g, speeds[i] / self.rows_per_unit, config.spot, prices.get(g).price(config.spot))
            for i, g in enumerate(gpus)
        ]
        plan = policy.plan(list(entries), len(gpus))
        self.view = RunView(
            self.store,
            self.layout,
            PlanIndex.build(plan, {e.chunk: float(e.est_tokens) for e in entries}),
            skew_margin_s=0.0,
            # A thousand workers share this view: one listing of every marker per claim at the end
            # of the run cost workers x chunks. Shared, a removed marker is seen within a lease TTL.
            recheck_every_s=config.lease_ttl_s,
            rng=random.Random(seed),
        )
        rows: float = sum(e.rows for e in entries)
        if config.prefixes:  # at best, each prefix is prefilled once in the whole run
            rows -= config.prefix_fraction * max(0, rows - config.prefixes)
        self.lower_bound_s = rows / sum(speeds) + config.restart_overhead_s
        self.segments: list[Segment] = []
        self.markers = 0
        self.last_marker = 0.0
        self.preemptions = 0
        self.rescues = 0
        self.end_game = False
        self._events: list[tuple[float, int, str, int, int]] = []
        zones = FleetZones(config.zones, ranked=config.zone_order == "ranked", rng=random.Random(seed * 17 + 3))
        self.zones = zones if config.zones else None
        self._seq = itertools.count()

    # -- the event loop ------------------------------------------------------------------------
    def run(self) -> FleetResult:
        with _cyclic_gc_paused():
            return self._run()

    def _run(self) -> FleetResult:
        for w in self.workers:
            self._at(self.config.restart_overhead_s, "ready", w)
            w.billed_since = 0.0
            self.segments.append(Segment(w.index, "restart", 0.0, self.config.restart_overhead_s))
            if w.spot and self.zones is None:  # with zones, each zone preempts what runs there
                for t in self.trace.preemptions.get(w.index, ()):
                    self._at(t, "preempt", w, epoch=-1)
        if self.deadline is not None:
            self._at(0.0, "control", self.workers[0], epoch=-1)
        handlers = {
            "ready": self._ready,
            "finish": self._finish,
            "renew": self._renew,
            "checkpoint": self._checkpoint,
            "preempt": self._preempt,
            "control": self._control,
            "zone-preempt": self._zone_preempt,
        }
        while self._events and self.markers < len(self.entries):
            t, _, kind, index, epoch = heapq.heappop(self._events)
            if t > self.config.horizon_s:
                self.clock.now = self.config.horizon_s  # cut at the horizon, not at its last event
                break
            self.clock.now = t
            w = self.workers[index]
            if epoch != -1 and epoch != w.epoch:
                continue  # an event of a session that ended (preempted, lost, finished)
            handlers[kind](w)
        return self._result()

    def _at(self, t: float, kind: str, w: SimWorker, epoch: int | None = None) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, w.index, w.epoch if epoch is None else epoch))

    # -- transitions -----------------------------------------------------------------------------
    def _ready(self, w: SimWorker) -> None:
        """A (new) worker process starts: its own claimer and heartbeat, a shared view of the run."""
        w.up = True
        w.provisioning_since = None
        if self.zones is not None and w.spot:
            self._at(self.zones.arrive(w.index, self.clock.now), "zone-preempt", w, epoch=-1)
        holder = f"{w.index}.{w.restarts}"
        w.claimer = ChunkClaimer(
            store=self.store,
            layout=self.layout,
            view=self.view,
            worker=str(w.index),
            holder=holder,
            ttl=self.config.lease_ttl_s,
            clock=self.clock,
            own=w.index,
            steal=self.policy.steal,
            rescue=self.policy.rescue,
            rows_per_s=functools.partial(_measured_rate, w),
            on_end_game=self._start_end_game,
        )
        w.heartbeat = HeartbeatPublisher(
            self.store,
            self.layout,
            Heartbeat(
                worker=str(w.index),
                holder=holder,
                state="running",
                accelerator=w.gpu,
                spot=w.spot,
                started_at=self.clock.now,
                updated_at=self.clock.now,
            ),
        )
        self._claim(w)

    def _claim(self, w: SimWorker) -> None:
        assert w.claimer is not None and w.heartbeat is not None
        held = w.claimer.next_chunk()
        if held is None:
            self._exit(w)
            return
        keeper = SimLeaseKeeper(self.store, self.layout, held, ttl=self.config.lease_ttl_s, clock=self.clock)
        job = ChunkJob(self.store, self.layout, keeper, UnitCodec(), self.clock, chunk_rows=self.units[held.chunk])
        point = job.resume()
        units = range(self.units[held.chunk])
        remaining = [i for i in units if i not in point.done_rows] if point.done_rows else list(units)
        speedup = prefix_speedup(self.config, self.policy.prefix_aware, self.entries[held.chunk], w.cached)
        w.session = Session(
            job, keeper, self.clock.now, remaining, speedup=speedup, next_renewal_at=self._next_renewal(self.clock.now)
        )
        self.holders[held.chunk] = w
        w.epoch += 1
        self._at(self.clock.now + len(remaining) / (w.rate * speedup), "finish", w)
        if self.end_game:
            self._at(w.session.next_renewal_at, "renew", w)
        if self.end_game and self.policy.checkpoints:
            self._at(self.clock.now + self.config.checkpoint_interval_s, "checkpoint", w)
        self._beat(w)

    def _finish(self, w: SimWorker) -> None:
        s = w.session
        assert s is not None
        # No renewal due is written first: the flush renews the lease now, over it, and nobody
        # reads the lease in between; nor that renewal, as the marker deletes the lease at once.
        try:
            with s.keeper.deferred():
                self._flush(w, len(s.remaining), self.clock.now)
                marker = s.job.complete(worker=str(w.index), model="sim", spec_hash="sim", accelerator=w.gpu)
        except LeaseLost:
            self._lose(w)
            self._claim(w)
            return
        self.segments.append(Segment(w.index, "work", s.start, self.clock.now, s.job.chunk))
        if marker is not None:
            self.markers += 1
            self.done_units += self.units[s.job.chunk]
            self.done.add(s.job.chunk)
            self.last_marker = self.clock.now
            w.chunks_done += 1
        self._end_session(w)
        w.epoch += 1
        self._claim(w)

    def _renew(self, w: SimWorker) -> None:
        """A renewal as a real event (the end game)."""
        s = w.session
        assert s is not None
        try:
            s.keeper.renew()
        except LeaseLost:
            self._lose(w)
            self._claim(w)
            return
        self._beat(w)
        s.next_renewal_at = self._next_renewal(self.clock.now)
        self._at(s.next_renewal_at, "renew", w)

    def _next_renewal(self, after: float) -> float:
        return after + self.config.lease_ttl_s / 3

    def _lease_read(self, key: str | None) -> None:
        """The store is about to hand out a lease (None: list them all): before the end game, its
        holder's renewal due by now is written first; in the end game, its holder's checkpoints
        not written yet (the module docstring). Renewals are real events by then."""
        if key is None:
            if not self.end_game:  # in the end game a listing reads only times (the module docstring)
                for w in list(self.holders.values()):
                    self._renew_due(w)
            return
        holder = self.holders.get(self.layout.chunk_of(key, self.layout.leases_prefix))
        if holder is not None and self.end_game:
            self._write_flushed(holder)
        elif holder is not None:
            self._renew_due(holder)

    def _renew_due(self, w: SimWorker) -> None:
        """Before the end game: write the last renewal due before now, at its own time.

        One due at this very instant is left for later, as its event would have come after the
        event being handled (scheduled a third of a TTL ago, after it)."""
        s = w.session
        if self.end_game or s is None or s.next_renewal_at >= self.clock.now:
            return
        due = s.next_renewal_at
        while s.next_renewal_at < self.clock.now:  # the same sums as one event per renewal
            due, s.next_renewal_at = s.next_renewal_at, self._next_renewal(s.next_renewal_at)
        saved, self.clock.now = self.clock.now, due
        try:
            s.keeper.renew()
        except LeaseLost as e:  # nobody takes a live holder's lease before the end game
            raise AssertionError(f"the simulator lost a live lease before the end game: {e}") from e
        finally:
            self.clock.now = saved

    def _checkpoint(self, w: SimWorker) -> None:
        """A checkpoint in the end game: flushed now, written when its lease is read (the module docstring)."""
        s = w.session
        assert s is not None
        now = self.clock.now
        if not s.keeper.unchanged():
            try:  # taken over: the flush fails on its renewal, as a written one would
                self._flush(w, self._units_done(w, now), now)
            except LeaseLost:
                self._lose(w)
                self._claim(w)
                return
            raise AssertionError(f"a flush renewed the lease of {s.job.chunk} that another holder wrote")
        s.flushed, s.flushed_at = max(s.flushed, self._units_done(w, now)), now
        self._at(now + self.config.checkpoint_interval_s, "checkpoint", w)

    def _write_flushed(self, w: SimWorker) -> None:
        """Write what the worker flushed in the end game and nobody has read yet, stamped as of its
        checkpoint (or its last renewal, if later: the lease never goes back in time)."""
        s = w.session
        if s is None or s.written >= s.flushed or s.keeper.lost is not None:
            return
        try:
            self._flush(w, s.flushed, max(s.flushed_at, s.keeper.held.lease.renewed_at))
        except LeaseLost as e:  # the lease is read before anyone takes it over
            raise AssertionError(f"the simulator lost a lease with checkpoints unwritten: {e}") from e

    def _preempt(self, w: SimWorker) -> None:
        if not w.up or w.exited_at is not None:
            return  # down already (restarting, or waiting for capacity), or finished
        self.preemptions += 1
        now = self.clock.now
        self._renew_due(w)
        if self.zones is not None:
            self.zones.leave(w.index, now, by_preemption=True)
        s = w.session
        if s is not None:
            if self.policy.checkpoints:
                boundary = (
                    s.start
                    + math.floor((now - s.start) / self.config.checkpoint_interval_s)
                    * self.config.checkpoint_interval_s
                )
                # As of the boundary (or the last renewal, if later): what had been flushed then.
                with contextlib.suppress(LeaseLost):
                    self._flush(w, self._units_done(w, boundary), max(boundary, s.keeper.held.lease.renewed_at))
            self._close_session(w, now)
        w.up = False
        w.cached = []  # a new machine: nothing cached
        w.epoch += 1
        w.restarts += 1
        self._bill(w, now)
        back = self.trace.available_at(w.gpu, now) if w.spot else now
        if back > now:
            self.segments.append(Segment(w.index, "wait", now, back))
        self.segments.append(Segment(w.index, "restart", back, back + self.config.restart_overhead_s))
        w.billed_since = back
        w.provisioning_since = back
        self._at(back + self.config.restart_overhead_s, "ready", w)

    def _zone_preempt(self, w: SimWorker) -> None:
        if self.zones is not None and self.zones.due(w.index, self.clock.now):
            self._preempt(w)

    # -- the deadline policy: the controller's decisions, every control interval --------------------
    def _control(self, _worker: SimWorker) -> None:
        assert self.deadline is not None
        now = self.clock.now
        state = fleet_state(self, now)
        decision = decide(state, self.deadline)
        if decision.action != "hold" or decision.mode != (self.decisions[-1].mode if self.decisions else None):
            self.decisions.append(decision)  # as `orch watch --deadline` logs them: actions and changes of mode
        for _ in range(decision.launch):
            self._launch_on_demand()
        for index in decision.retire:
            self._retire(self.workers[index])
        self._at(now + self.config.control_interval_s, "control", self.workers[0], epoch=-1)

    def _launch_on_demand(self) -> None:
        gpu = self.rng.choice(self.config.gpus)
        info = self.prices.get(gpu)
        rate = self.config.base_rows_per_s * info.relative_speed / self.rows_per_unit
        w = SimWorker(len(self.workers), gpu, rate, spot=False, price=info.on_demand_usd_h, extra=True)
        self.workers.append(w)
        self.on_demand_launched += 1
        now = self.clock.now
        w.billed_since = now
        w.provisioning_since = now
        self.segments.append(Segment(w.index, "restart", now, now + self.config.restart_overhead_s))
        self._at(now + self.config.restart_overhead_s, "ready", w)

    def _retire(self, w: SimWorker) -> None:
        """`orch cancel` of one worker: SIGTERM, so it flushes what it finished and gives its lease back."""
        now = self.clock.now
        s = w.session
        if s is not None:
            self._renew_due(w)
            try:
                self._flush(w, self._units_done(w, now), now)
                s.keeper.release()
            except LeaseLost:
                pass
            self._close_session(w, now)
        w.retired = True
        w.epoch += 1  # its pending events (a start-up, a finish) are void
        w.exited_at = now
        w.up = False
        self._bill(w, now)

    def units_done_now(self) -> int:
        busy = sum(
            self.units[w.session.job.chunk] - len(w.session.remaining) + self._units_done(w, self.clock.now)
            for w in self.workers
            if w.session is not None
        )
        return self.done_units + busy

    def cost_until(self, now: float) -> float:
        return sum(
            (w.billed_s + (now - w.billed_since if w.billed_since is not None else 0.0)) / 3600 * w.price
            for w in self.workers
        )

    # -- helpers ---------------------------------------------------------------------------------
    def _units_done(self, w: SimWorker, t: float) -> int:
        s = w.session
        assert s is not None
        return min(len(s.remaining), int((t - s.start) * w.rate * s.speedup + 1e-9))

    def _flush(self, w: SimWorker, upto: int, at: float) -> None:
        s = w.session
        assert s is not None
        upto = max(upto, s.flushed)  # with what was flushed in the end game and not written yet
        rows = unit_rows(s.remaining[s.written : upto])
        saved, self.clock.now = self.clock.now, at
        try:
            s.job.checkpoint(rows)
        finally:
            self.clock.now = saved
        s.flushed = s.written = upto

    def _lose(self, w: SimWorker) -> None:
        """Our lease was taken over (a rescue): rows since the last flush are lost."""
        self.rescues += 1
        self._close_session(w, self.clock.now)
        w.epoch += 1

    def _close_session(self, w: SimWorker, now: float) -> None:
        s = w.session
        assert s is not None
        useful_until = s.start + s.flushed / w.rate
        if useful_until > s.start:
            self.segments.append(Segment(w.index, "work", s.start, useful_until, s.job.chunk))
        if now > useful_until:
            self.segments.append(Segment(w.index, "lost", useful_until, now, s.job.chunk))
        self._end_session(w)

    def _end_session(self, w: SimWorker) -> None:
        assert w.session is not None
        if self.holders.get(w.session.job.chunk) is w:
            del self.holders[w.session.job.chunk]
        w.session = None

    def _beat(self, w: SimWorker) -> None:
        if not self.end_game:
            return  # unobservable before the end game (see the module docstring)
        s = w.session
        assert w.heartbeat is not None
        done = (self.units[s.job.chunk] - len(s.remaining) + self._units_done(w, self.clock.now)) if s else 0
        w.heartbeat.publish(
            state="running",
            chunk=s.job.chunk if s else None,
            chunk_rows=self.units[s.job.chunk] if s else 0,
            chunk_rows_done=done,
            rows_per_s=w.rate,
            chunks_done=w.chunks_done,
            updated_at=self.clock.now,
        )

    def _exit(self, w: SimWorker) -> None:
        w.exited_at = self.clock.now
        if self.zones is not None and w.spot:
            self.zones.leave(w.index, self.clock.now, by_preemption=False)
        w.up = False
        self._bill(w, self.clock.now)
        assert w.heartbeat is not None
        if self.end_game:
            w.heartbeat.publish(state="exited", chunk=None, updated_at=self.clock.now)

    def _bill(self, w: SimWorker, now: float) -> None:
        if w.billed_since is not None:
            w.billed_s += now - w.billed_since
            w.billed_since = None

    def _start_end_game(self) -> None:
        if self.end_game:
            return
        for w in self.workers:
            self._renew_due(w)
        self.end_game = True
        for w in self.workers:
            if w.session is not None:
                self._at(w.session.next_renewal_at, "renew", w)  # renewals are real events from now on
            if w.session is not None and w.heartbeat is not None:
                self._beat(w)
        if not self.policy.checkpoints:
            return
        for w in self.workers:
            if w.session is not None:
                # Catch up to the last boundary (flushes that were due but unobserved), then flush live.
                s = w.session
                boundary = (
                    s.start
                    + math.floor((self.clock.now - s.start) / self.config.checkpoint_interval_s)
                    * self.config.checkpoint_interval_s
                )
                s.flushed = max(s.flushed, self._units_done(w, boundary))
                s.flushed_at = max(boundary, s.keeper.held.lease.renewed_at)
                self._at(boundary + self.config.checkpoint_interval_s, "checkpoint", w)

    def _result(self) -> FleetResult:
        end = self.last_marker if self.markers == len(self.entries) else self.clock.now
        for w in self.workers:
            if w.billed_since is not None:  # still up at the end (only if the run did not finish)
                self._bill(w, end)

        def hours(kind: str) -> float:
            return sum(s.end - s.start for s in self.segments if s.kind == kind) / 3600

        idle_tail = sum(max(end - w.exited_at, 0.0) for w in self.workers if w.exited_at is not None) / 3600
        return FleetResult(
            policy=self.policy.name,
            seed=self.seed,
            complete=self.markers == len(self.entries),
            makespan_s=end,
            lower_bound_s=self.lower_bound_s,
            billed_gpu_h=sum(w.billed_s for w in self.workers) / 3600,
            lost_gpu_h=hours("lost"),
            restart_gpu_h=hours("restart"),
            idle_tail_gpu_h=idle_tail,
            cost_usd=sum(w.billed_s / 3600 * w.price for w in self.workers),
            chunks=len(self.entries),
            markers=self.markers,
            preemptions=self.preemptions,
            rescues=self.rescues,
            workers=[
                {
                    "worker": w.index,
                    "gpu": w.gpu,
                    "spot": w.spot,
                    "chunks_done": w.chunks_done,
                    "restarts": w.restarts,
                    "exited_at": w.exited_at,
                    "billed_h": w.billed_s / 3600,
                    "extra": w.extra,
                }
                for w in self.workers
            ],
            segments=self.segments,
            deadline_s=self.deadline.deadline_s if self.deadline else None,
            on_demand_launched=self.on_demand_launched,
            decisions=self.decisions,
        )


def fleet_state(fleet: Fleet, now: float) -> FleetState:
    """The simulated fleet as the deadline policy sees it: the FleetState `orch watch --deadline`
    builds from a real run.

    Spot workers are counted as the watch loop counts SkyPilot's jobs (fleet/deadline_control.py):
    up, or coming up on capacity already found (a restart under way); waiting for capacity (preempted
    into an outage: their next start lies beyond now); and all of them together, the fleet's pace once
    spot is back. With zones, the reserve's mean up spell is the ranking's (planning/zone_steering.py),
    learned from the same zone history that steers the simulated spot workers."""
    config = fleet.config
    gpus = [fleet.prices.get(g) for g in config.gpus]
    new_rate = sum(config.base_rows_per_s * g.relative_speed for g in gpus) / len(gpus) / fleet.rows_per_unit
    spot = [w for w in fleet.workers if w.spot and w.exited_at is None]
    up = [w for w in spot if w.up or (w.provisioning_since is not None and w.provisioning_since <= now)]
    mean_up_s = PRIOR_UP_S
    if fleet.zones is not None:
        ranked = rank_zones(list(config.zones), fleet.zones.history, [], now, ZoneModel())
        mean_up_s = max(r.mean_up_s for r in ranked)
    return FleetState(
        elapsed_s=now,
        total_rows=float(sum(fleet.units.values())),
        done_rows=float(fleet.units_done_now()),
        spot_rate=sum(w.rate for w in up),
        spot_waiting=len(spot) - len(up),
        spot_pace=sum(w.rate for w in spot),
        mean_up_s=mean_up_s,
        on_demand=[OnDemandWorker(w.index, w.rate, w.up) for w in fleet.workers if w.extra and w.exited_at is None],
        new_worker_rate=new_rate,
        new_worker_usd_h=sum(g.on_demand_usd_h for g in gpus) / len(gpus),
        cost_so_far_usd=fleet.cost_until(now),
        largest_chunk_rows=float(max((u for c, u in fleet.units.items() if c not in fleet.done), default=0)),
        open_chunks=len(fleet.units) - len(fleet.done) - sum(1 for w in fleet.workers if w.up and w.session),
    )

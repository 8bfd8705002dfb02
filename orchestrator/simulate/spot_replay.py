"""One job replayed over a spot trace, tick by tick: what a policy chose, what it cost, whether it was on time.

The accounting every score uses (the optimum's dynamic program in `spot_optimum` counts the same way):
1. Time runs in the trace's ticks of G seconds; the deadline is the last whole tick before it.
2. At the start of each tick the policy sees this tick's capacity, and picks spot in a zone with
   capacity, on-demand, or nothing. A spot machine whose zone loses capacity is gone before the
   policy chooses (a preemption). What a policy may read of the capacity is its own rule: one that
   sees every zone (as a launcher trying the zones in turn learns) reads `View.up`; one that sees
   only the zone it is in, as the published benchmark's interface allows, reads `View.has_spot`.
3. The job is always in a zone (`View.zone`): where its spot machine runs, else where it looks for
   spot next. Nothing and on-demand may name a zone to move to; a move costs nothing by itself.
4. A new machine (a start, a restart after a preemption, a move between spot and on-demand, and in
   orch's cost model a spot machine moved between zones) computes nothing for its first
   `overhead_s`; a machine kept computes the whole tick.
5. A tick with a machine is billed whole at its market's price (`CostModel`); the job ends at the
   end of the tick in which its work is done. A job not done by the deadline is finished on
   on-demand after it (one restart included) so its cost stays comparable, and counted as missed.
   Under the benchmark's cost model every spot tick is billed at the price of the zone the job
   ends in, as the published simulator bills.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from orchestrator.simulate.spot_traces import ORCH_COSTS, CostModel, H, Job, Trace

Market = Literal["none", "spot", "on-demand"]


@dataclass(frozen=True)
class Choice:
    market: Market
    #: An index into Trace.zones: where the spot machine runs, or the zone nothing and on-demand move
    #: the job to (rule 3); None stays in the job's zone.
    zone: int | None = None


@dataclass(frozen=True)
class View:
    """What a policy knows at the start of a tick: the past, the job, and this tick's capacity."""

    tick: int
    gap_s: float
    job: Job
    deadline_ticks: int
    done_s: float
    market: Market  # what runs now ("none" right after a preemption)
    zone: int  # the zone the job is in (rule 3)
    ticks_on: int  # ticks the current machine has run (its overhead is paid over the first ones)
    up: tuple[bool, ...]  # per zone: spot capacity in this tick

    @property
    def elapsed_s(self) -> float:
        return self.tick * self.gap_s

    @property
    def time_left_s(self) -> float:
        return (self.deadline_ticks - self.tick) * self.gap_s

    @property
    def has_spot(self) -> bool:
        """Spot capacity in the job's own zone this tick: all a policy of one zone may read."""
        return self.up[self.zone]

    @property
    def work_left_s(self) -> float:
        return max(self.job.work_s - self.done_s, 0.0)

    @property
    def overhead_left_s(self) -> float:
        """What the running machine still has to pay of its start-up (0 with nothing running)."""
        if self.market == "none":
            return 0.0
        return max(self.job.overhead_s - self.ticks_on * self.gap_s, 0.0)


class SpotPolicy(Protocol):
    """Chooses, each tick, where the job runs. A fresh one replays each trace (it may learn within it)."""

    def choose(self, view: View) -> Choice: ...


#: A fresh policy for one replay, from a seed naming the replay (trace and draw): a randomized policy
#: draws from it, so every score is reproducible; a deterministic one ignores it.
PolicyFactory = Callable[[str], SpotPolicy]


@dataclass
class Outcome:
    cost_usd: float
    met: bool
    finished_tick: int | None
    launches: int = 0
    preemptions: int = 0
    zone_switches: int = 0  # spot machines in another zone than the last spot machine's
    spot_ticks: int = 0
    on_demand_ticks: int = 0
    overhead_s: float = 0.0  # billed time that computed nothing


def tick_work(ticks_on: int, gap_s: float, overhead_s: float) -> float:
    """Seconds of work a machine does in its (ticks_on + 1)-th tick: the overhead comes off the first ones."""

    def after(ticks: int) -> float:
        return min(max(ticks * gap_s - overhead_s, 0.0), ticks * gap_s)

    return after(ticks_on + 1) - after(ticks_on)


def deadline_ticks(job: Job, gap_s: float) -> int:
    return int(job.deadline_s // gap_s + 1e-9)


def replay(job: Job, trace: Trace, policy: SpotPolicy, costs: CostModel = ORCH_COSTS) -> Outcome:
    """The job over the trace under `policy` (the numbered rules in the module docstring)."""
    gap, limit = trace.gap_s, deadline_ticks(job, trace.gap_s)
    if trace.ticks < limit:
        raise ValueError(f"trace {trace.name} covers {trace.ticks * gap / H:.1f} h, less than the deadline")
    out = Outcome(cost_usd=0.0, met=False, finished_tick=None)
    market: Market = "none"
    zone, last_spot_zone, ticks_on, done = 0, -1, 0, 0.0
    for t in range(limit):
        up = tuple(u[t] for u in trace.up)
        if market == "spot" and not up[zone]:
            market, out.preemptions = "none", out.preemptions + 1
        choice = policy.choose(View(t, gap, job, limit, done, market, zone, ticks_on, up))
        to = zone if choice.zone is None else choice.zone
        if choice.market == "spot" and not up[to]:
            raise ValueError(f"tick {t}: spot chosen in {trace.zones[to]}, which has no capacity")
        moved_spot = choice.market == "spot" and market == "spot" and to != zone
        if choice.market != market or (moved_spot and not costs.free_spot_moves):
            ticks_on = 0
            if choice.market != "none":
                out.launches += 1
        if choice.market == "spot":
            out.zone_switches += last_spot_zone not in (-1, to)
            last_spot_zone = to
        market, zone = choice.market, to
        if market == "none":
            continue
        work = tick_work(ticks_on, gap, job.overhead_s)
        out.overhead_s += gap - work
        ticks_on += 1
        if market == "spot":
            out.spot_ticks += 1
        else:
            out.on_demand_ticks += 1
        done += work
        if done >= job.work_s - 1e-6:
            out.met, out.finished_tick = True, t + 1
            break
    out.cost_usd = (
        (out.spot_ticks * costs.spot_price(trace, zone) + out.on_demand_ticks * costs.on_demand_usd_h) * gap / H
    )
    if not out.met:
        out.cost_usd += (job.work_s - done + job.overhead_s) / H * costs.on_demand_usd_h
    return out


def on_demand_cost(job: Job, gap_s: float, costs: CostModel = ORCH_COSTS) -> float:
    """On-demand from the start: one overhead, whole ticks (the share every cost is quoted against)."""
    ticks = -(-(job.work_s + job.overhead_s) // gap_s)
    return ticks * gap_s / H * costs.on_demand_usd_h

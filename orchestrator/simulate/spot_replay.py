"""One job replayed over a spot trace, tick by tick: what a policy chose, what it cost, whether it was on time.

The accounting every score uses (the optimum's dynamic program in `spot_optimum` counts the same way):
1. Time runs in the trace's ticks of G seconds; the deadline is the last whole tick before it.
2. At the start of each tick the policy sees every zone's capacity for that tick (as a launcher
   trying the zones in turn would), and picks spot in a zone with capacity, on-demand, or nothing.
   A spot machine whose zone loses capacity is gone before the policy chooses (a preemption).
3. A new machine (a start, a restart after a preemption, a move between spot and on-demand or
   between zones) computes nothing for its first `overhead_s`; a machine kept computes the whole tick.
4. A tick with a machine is billed whole at its market's price; the job ends at the end of the tick
   in which its work is done. A job not done by the deadline is finished on on-demand after it (one
   restart included) so its cost stays comparable, and counted as missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from orchestrator.simulate.spot_traces import H, Job, Trace

Market = Literal["none", "spot", "on-demand"]


@dataclass(frozen=True)
class Choice:
    market: Market
    zone: int = 0  # the zone of a spot machine (an index into Trace.zones)


@dataclass(frozen=True)
class View:
    """What a policy knows at the start of a tick: the past, the job, and this tick's capacity."""

    tick: int
    gap_s: float
    job: Job
    deadline_ticks: int
    done_s: float
    market: Market  # what runs now ("none" right after a preemption)
    zone: int
    ticks_on: int  # ticks the current machine has run (its overhead is paid over the first ones)
    up: tuple[bool, ...]  # per zone: spot capacity in this tick

    @property
    def elapsed_s(self) -> float:
        return self.tick * self.gap_s

    @property
    def time_left_s(self) -> float:
        return (self.deadline_ticks - self.tick) * self.gap_s


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
    zone_switches: int = 0  # spot launches in another zone than the last spot machine's
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


def replay(job: Job, trace: Trace, policy: SpotPolicy) -> Outcome:
    """The job over the trace under `policy` (the numbered rules in the module docstring)."""
    gap, limit = trace.gap_s, deadline_ticks(job, trace.gap_s)
    if trace.ticks < limit:
        raise ValueError(f"trace {trace.name} covers {trace.ticks * gap / H:.1f} h, less than the deadline")
    price = {"spot": job.spot_usd_h * gap / H, "on-demand": job.on_demand_usd_h * gap / H}
    out = Outcome(cost_usd=0.0, met=False, finished_tick=None)
    market: Market = "none"
    zone, last_spot_zone, ticks_on, done = 0, -1, 0, 0.0
    for t in range(limit):
        up = tuple(u[t] for u in trace.up)
        if market == "spot" and not up[zone]:
            market, out.preemptions = "none", out.preemptions + 1
        choice = policy.choose(View(t, gap, job, limit, done, market, zone, ticks_on, up))
        if choice.market == "spot" and not up[choice.zone]:
            raise ValueError(f"tick {t}: spot chosen in {trace.zones[choice.zone]}, which has no capacity")
        if choice.market != market or (choice.market == "spot" and choice.zone != zone):
            ticks_on = 0
            if choice.market != "none":
                out.launches += 1
            if choice.market == "spot":
                out.zone_switches += last_spot_zone not in (-1, choice.zone)
                last_spot_zone = choice.zone
        market, zone = choice.market, choice.zone
        if market == "none":
            continue
        work = tick_work(ticks_on, gap, job.overhead_s)
        out.overhead_s += gap - work
        ticks_on += 1
        out.cost_usd += price[market]
        if market == "spot":
            out.spot_ticks += 1
        else:
            out.on_demand_ticks += 1
        done += work
        if done >= job.work_s - 1e-6:
            out.met, out.finished_tick = True, t + 1
            return out
    out.cost_usd += (job.work_s - done + job.overhead_s) / H * job.on_demand_usd_h
    return out


def on_demand_cost(job: Job, gap_s: float) -> float:
    """On-demand from the start: one overhead, whole ticks (the share every cost is quoted against)."""
    ticks = -(-(job.work_s + job.overhead_s) // gap_s)
    return ticks * gap_s / H * job.on_demand_usd_h

"""The published baselines every spot/deadline saving is quoted against: the paper's Uniform Progress, one zone,
with failover across zones, and round robin.

Uniform Progress ("Can't Be Late", Wu et al., NSDI'24; `rc_cr_threshold` in its simulator, sky_spot),
written here from the paper's rule. The uniform line asks for work x t / deadline done at time t
(no allowance for the first start-up). Each tick, with `has_spot` the capacity it is allowed to see:
1. spot when it has capacity; else wait (nothing) while progress is at or ahead of the line, and
   on-demand when behind it;
2. once on on-demand, stay there while spot has no capacity or progress is not past the line at
   t + 2 x restart (hysteresis: a return to spot pays a restart, and the next preemption another);
3. safety: with nothing or on-demand running, on-demand once the work left plus two restarts no
   longer fits in the whole ticks left; once the work left plus one restart no longer fits, keep
   a spot machine that has finished its start-up (it is the fastest way to the end), else on-demand.
   (With no restart overhead, spot is free to take whenever it has capacity.)

Three ways to see zones, as published:
- `uniform-progress`: failover across zones, as SkyPilot's launcher gives: spot has capacity if
  any zone has some; a machine stays in its zone while it has capacity, else goes to the first
  listed with capacity.
- `uniform-progress-one-zone`: the first zone listed only (the single-region rule on its own).
- `uniform-progress-round-robin`: the rule on its own zone's capacity only, as the benchmark's
  interface allows (the baseline of ADRS's multi-region +27%); when its zone has no spot and the
  rule would wait, it moves to the next zone listed and sees that zone's capacity the next tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.simulate.spot_replay import Choice, Market, View


def uniform_progress(view: View, has_spot: bool) -> Market:
    """The paper's rule (rules 1-3 of the module docstring) for one tick, on the capacity it sees."""
    job, gap = view.job, view.gap_s
    left = view.work_left_s
    if left <= 1e-3:
        return "none"
    t, running = view.elapsed_s, view.market

    def line(at: float) -> float:
        return job.work_s * at / job.deadline_s

    market: Market = "spot" if has_spot else "none"
    if view.done_s < line(t) and not has_spot:
        market = "on-demand"
    if running == "on-demand" and (not has_spot or view.done_s <= line(t + 2 * job.overhead_s)):
        market = "on-demand"
    time_left = view.time_left_s
    if running != "spot" and _whole_ticks(left + 2 * job.overhead_s, gap) >= time_left:
        market = "on-demand"
    if _whole_ticks(left + job.overhead_s, gap) >= time_left:
        market = "spot" if running == "spot" and view.overhead_left_s < 1e-3 else "on-demand"
        if job.overhead_s == 0 and has_spot:
            market = "spot"
    return market


def _whole_ticks(seconds: float, gap_s: float) -> float:
    return math.ceil(seconds / gap_s) * gap_s


@dataclass
class UniformProgress:
    """The paper's rule with failover across zones, or (`one_zone`) on the first zone listed only."""

    one_zone: bool = False

    def choose(self, view: View) -> Choice:
        up = view.up[:1] if self.one_zone else view.up
        market = uniform_progress(view, any(up))
        if market != "spot":
            return Choice(market)
        if view.market == "spot" and up[view.zone]:
            return Choice("spot", view.zone)
        return Choice("spot", up.index(True))


@dataclass
class UniformProgressRoundRobin:
    """The paper's rule on its own zone's capacity; waiting without it, it moves to the next zone."""

    def choose(self, view: View) -> Choice:
        market = uniform_progress(view, view.has_spot)
        if market == "none" and not view.has_spot:
            return Choice("none", (view.zone + 1) % len(view.up))
        return Choice(market)

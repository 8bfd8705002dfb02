"""orch's deadline policy (planning/deadline.py's `decide`) steering one job over a spot trace, and the baselines.

A job is a fleet of one: its work counted in seconds (rows at one row per second), the spot
worker "up" whenever a zone has capacity (SkyPilot keeps relaunching spot workers; the policy adds
on-demand on top of them), one on-demand worker at most. `decide`'s actions then map to markets:
- launch (behind the uniform line with no spot, or the slack gone): run on on-demand;
- retire (comfortably ahead): leave on-demand for spot;
- hold: keep what runs; with nothing running, take spot if a zone has capacity, else wait.
A single machine runs at a time: where `decide` would keep an on-demand worker beside spot, the job
stays on on-demand (the fleet would pay both; one job gains nothing from the second).

The rates are exact in a replay, so `margin` (the allowance for rate estimates) is 0; the commit
margin is one tick (the policy decides once a tick).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.planning.deadline import DeadlineSettings, FleetState, OnDemandWorker, decide
from orchestrator.planning.spot_zones import SpotDeadlinePolicy, ZoneModel, draw_restarts_factor
from orchestrator.simulate.spot_replay import Choice, PolicyFactory, SpotPolicy, View


def deadline_settings(view: View, *, greedy: bool) -> DeadlineSettings:
    return DeadlineSettings(
        deadline_s=view.deadline_ticks * view.gap_s,
        restart_overhead_s=view.job.overhead_s,
        margin=0.0,
        max_on_demand=1,
        commit_margin_s=view.gap_s,
        greedy=greedy,
    )


def fleet_of_one(view: View) -> FleetState:
    """The job as `decide` sees a fleet: one spot worker up while any zone has capacity, and the
    on-demand worker if the job runs on one (up once past its overhead)."""
    on_demand = []
    if view.market == "on-demand":
        on_demand = [OnDemandWorker(0, 1.0, up=view.ticks_on * view.gap_s >= view.job.overhead_s)]
    return FleetState(
        elapsed_s=view.elapsed_s,
        total_rows=view.job.work_s,
        done_rows=view.done_s,
        spot_rate=1.0 if any(view.up) else 0.0,
        on_demand=on_demand,
        new_worker_rate=1.0,
        new_worker_usd_h=view.job.on_demand_usd_h,
    )


def first_zone_up(view: View) -> int:
    """SkyPilot's ordered failover: the zone that runs while it has capacity, else the first listed with it."""
    if view.market == "spot" and view.up[view.zone]:
        return view.zone
    return view.up.index(True)


@dataclass
class UniformProgress:
    """`decide` as orch ships it (greedy=True: the paper's greedy baseline), zones in listed order."""

    greedy: bool = False
    pick_zone: Callable[[View], int] = first_zone_up
    #: Only the first zone listed: the published single-region baseline, for reference.
    one_zone: bool = False

    def choose(self, view: View) -> Choice:
        if self.one_zone:
            view = replace(view, up=view.up[:1])
        decision = decide(fleet_of_one(view), deadline_settings(view, greedy=self.greedy))
        if decision.action == "launch" or (decision.action == "hold" and view.market == "on-demand"):
            return Choice("on-demand")
        if any(view.up):
            return Choice("spot", self.pick_zone(view))
        return Choice("none")


@dataclass
class ZoneAware:
    """The better policy (planning/spot_zones.py), driven tick by tick: its zone model learns from
    every tick's capacity, its safety rule is `decide`'s commit."""

    policy: SpotDeadlinePolicy

    def choose(self, view: View) -> Choice:
        self.policy.zones.observe(view.up, view.gap_s)
        committed = decide(fleet_of_one(view), deadline_settings(view, greedy=True)).mode == "critical"
        market, zone = self.policy.choose(
            slack_s=view.time_left_s - (view.job.work_s - view.done_s) - view.job.overhead_s,
            time_left_s=view.time_left_s,
            running=view.market,
            zone=view.zone,
            up=view.up,
            overhead_s=view.job.overhead_s,
            tick_s=view.gap_s,
            committed=committed,
        )
        return Choice(market, zone)


def zone_aware(**knobs: float) -> PolicyFactory:
    return lambda _seed: ZoneAware(SpotDeadlinePolicy(ZoneModel(), **knobs))


def zone_aware_randomized(seed: str) -> SpotPolicy:
    """The zone-aware policy with its reserve multiplier drawn from the replay's seed (spot_zones rule 6)."""
    return ZoneAware(SpotDeadlinePolicy(ZoneModel(), restarts_factor=draw_restarts_factor(seed)))


#: The policies the scorer compares, by name.
POLICIES: dict[str, PolicyFactory] = {
    "uniform-progress": lambda _seed: UniformProgress(),
    "uniform-progress-one-zone": lambda _seed: UniformProgress(one_zone=True),
    "greedy": lambda _seed: UniformProgress(greedy=True),
    "zone-aware": zone_aware(),
}
RANDOMIZED = "zone-aware-randomized"

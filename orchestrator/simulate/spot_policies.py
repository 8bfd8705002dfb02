"""orch's spot/deadline policies for one job over a spot trace: the planned ones, and the fleet's rules for reference.

The planned policies (`zone-aware`, `own-zone`) choose each tick from a table of the dynamic program
in spot_plan.py, for the capacity they see and the spells they have seen; around it:
1. Commit: once the slack (time left, less the work left and one start-up) is within one tick,
   run on on-demand to the end: a tick costs at most one tick of slack, so this comes in time and
   the deadline is kept whatever the trace does.
2. Guard: a new spot machine only while the slack covers its start-up, an on-demand start after
   it and a tick (otherwise on-demand): a spot machine lost right after its start still leaves
   rule 1 room to finish.
3. Zones, by what each may see:
   - `zone-aware` sees every zone (as a launcher trying the zones in turn learns): capacity is any
     zone's; a machine stays in its zone while it has capacity, else goes to the zone whose running
     up spell should last longest (planning/spot_zones.py's ZoneModel, the ranking real
     launches use);
   - `own-zone` sees only the zone it is in, as the published benchmark's interface allows. With
     no spot there and nothing or on-demand running, it moves (a move costs nothing then) to a
     zone not seen without capacity lately, the one where its looks have found capacity most
     often, and sees that zone the next tick (by odds alone it went back and forth between two
     zones seen down while a third had spot: tune half, ADRS setting, 12.8% -> 15.2% below UP
     round robin with "lately" 80 minutes; 16 minutes to 2 h 10 min gave 14.3-15.2%). A
     look in another zone than the last one finds a spell that began unseen: the spell it left
     ends in no fit (it was not seen to end), and one found up is taken to be `ARRIVAL_AGE_S` old,
     not new: a look lands more often in a long spell than in a short one, so a spell found up
     has likely lasted a while (tune half: 0 to 6 ticks of 195 s tried, 4 best, own-zone 11.5% ->
     12.8% below UP round robin on the ADRS setting, 8.1% -> 9.6% at high/36 h/0.20 h).

The fleet's rules, as `orch watch --deadline` runs them on a fleet (planning/deadline.py's
`decide`, planning/spot_zones.py's `wait_for_spot`), scored for reference: a job is a fleet of
one, its work counted in seconds, the spot worker "up" whenever a zone has capacity, one on-demand
worker at most. `decide`'s actions map to markets: launch (behind its line with no spot, or the
slack gone): on-demand; retire: leave on-demand for spot; hold: keep what runs, or take spot if a
zone has capacity. The rates are exact in a replay, so `margin` is 0; the commit margin is one tick.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.planning.deadline import DeadlineSettings, FleetState, OnDemandWorker, decide
from orchestrator.planning.spot_zones import SpotDeadlinePolicy, ZoneModel, draw_restarts_factor
from orchestrator.simulate.spot_baselines import UniformProgress, UniformProgressRoundRobin
from orchestrator.simulate.spot_plan import SPELL_PRIOR, SpellPrior, SpellWatch, plan
from orchestrator.simulate.spot_replay import Choice, Market, PolicyFactory, SpotPolicy, View
from orchestrator.simulate.spot_traces import ON_DEMAND_USD_H


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
        new_worker_usd_h=ON_DEMAND_USD_H,
    )


def first_zone_up(view: View) -> int:
    """SkyPilot's ordered failover: the zone that runs while it has capacity, else the first listed with it."""
    if view.market == "spot" and view.up[view.zone]:
        return view.zone
    return view.up.index(True)


@dataclass
class FleetDecide:
    """`decide` as orch's fleet controller runs it with no spot worker waiting (its Uniform Progress,
    which leaves on-demand only 5% of the work ahead of its line; greedy=True: the paper's greedy
    baseline), zones in listed order."""

    greedy: bool = False
    pick_zone: Callable[[View], int] = first_zone_up

    def choose(self, view: View) -> Choice:
        decision = decide(fleet_of_one(view), deadline_settings(view, greedy=self.greedy))
        if decision.action == "launch" or (decision.action == "hold" and view.market == "on-demand"):
            return Choice("on-demand")
        if any(view.up):
            return Choice("spot", self.pick_zone(view))
        return Choice("none")


@dataclass
class WaitForSpot:
    """The fleet's wait-for-spot rule (planning/spot_zones.py's SpotDeadlinePolicy), driven tick by
    tick: its zone model learns from every tick's capacity, its safety rule is `decide`'s commit."""

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
        return Choice(market, zone) if market == "spot" else Choice(market)


def wait_for_spot_randomized(seed: str) -> SpotPolicy:
    """The wait-for-spot rule with its reserve multiplier drawn from the replay's seed (spot_zones rule 6)."""
    return WaitForSpot(SpotDeadlinePolicy(ZoneModel(), restarts_factor=draw_restarts_factor(seed)))


#: The age the own-zone policy gives a spell it finds up on a look in another zone (rule 3).
ARRIVAL_AGE_S = 780.0
#: A zone whose last look found no spot within this is looked in last by the own-zone policy (rule 3).
RECENT_DOWN_S = 4800.0


@dataclass
class _Memory:
    """What a planned policy has seen of one trace."""

    watch: SpellWatch
    zones: ZoneModel
    looks: list[tuple[int, int]]  # own zone: per zone, (looks, looks that found capacity)
    looked_in: int  # own zone: the zone of the last look
    down_at: list[float | None]  # own zone: per zone, when a look last found no capacity there


@dataclass
class Planned:
    """The planned policies (rules 1-3 of the module docstring)."""

    sees_every_zone: bool
    prior: SpellPrior
    memory: _Memory | None = None

    def choose(self, view: View) -> Choice:
        job, tick_s = view.job, view.gap_s
        if self.memory is None:
            zones = len(view.up)
            self.memory = _Memory(
                SpellWatch(self.prior, tick_s), ZoneModel(), [(0, 0)] * zones, view.zone, [None] * zones
            )
        memory = self.memory
        seen = any(view.up) if self.sees_every_zone else view.has_spot
        if self.sees_every_zone or view.zone == memory.looked_in:
            memory.watch.see(seen)
        else:
            memory.watch.arrive(seen, max(round(ARRIVAL_AGE_S / tick_s), 1) if seen else 1)
            memory.looked_in = view.zone
        if self.sees_every_zone:
            memory.zones.observe(view.up, tick_s)
        else:
            looks, found = memory.looks[view.zone]
            memory.looks[view.zone] = (looks + 1, found + view.has_spot)
            if not view.has_spot:
                memory.down_at[view.zone] = view.elapsed_s
        slack = view.time_left_s - view.work_left_s - job.overhead_s
        if slack <= tick_s:
            return self._elsewhere(view, "on-demand", memory)
        table = plan(memory.watch, view.deadline_ticks, job.work_s, job.overhead_s)
        running = view.market
        market = table.market(view.tick, seen, memory.watch.age, running, view.ticks_on, slack + job.overhead_s)
        if market != "spot":
            return self._elsewhere(view, market, memory)
        zone = view.zone if view.has_spot else memory.zones.best(view.up)
        launches = running != "spot" or zone != view.zone
        if launches and slack - job.overhead_s <= tick_s:
            return self._elsewhere(view, "on-demand", memory)
        return Choice("spot", zone)

    def _elsewhere(self, view: View, market: Market, memory: _Memory) -> Choice:
        """Nothing or on-demand; the own-zone policy, with no spot where it is, moves to look elsewhere:
        to a zone not found without capacity in the last `RECENT_DOWN_S` (spells last: one seen down
        lately likely still is), then to the zone whose looks found capacity most often (a look worth
        a Beta(1, 1) prior), ties going to the next zone listed after this one."""
        if self.sees_every_zone or view.has_spot or len(view.up) == 1:
            return Choice(market)
        count = len(view.up)

        def odds(zone: int) -> tuple[bool, float, int]:
            looks, found = memory.looks[zone]
            down_at = memory.down_at[zone]
            lately_down = down_at is not None and view.elapsed_s - down_at <= RECENT_DOWN_S
            return not lately_down, (found + 1) / (looks + 2), -((zone - view.zone) % count)

        return Choice(market, max((z for z in range(count) if z != view.zone), key=odds))


def planned(*, sees_every_zone: bool, prior: SpellPrior = SPELL_PRIOR) -> PolicyFactory:
    return lambda _seed: Planned(sees_every_zone, prior)


#: The policies the scorer compares, by name.
POLICIES: dict[str, PolicyFactory] = {
    "uniform-progress": lambda _seed: UniformProgress(),
    "uniform-progress-one-zone": lambda _seed: UniformProgress(one_zone=True),
    "uniform-progress-round-robin": lambda _seed: UniformProgressRoundRobin(),
    "uniform-progress-fleet": lambda _seed: FleetDecide(),
    "greedy": lambda _seed: FleetDecide(greedy=True),
    "wait-for-spot": lambda _seed: WaitForSpot(SpotDeadlinePolicy(ZoneModel())),
    "zone-aware": planned(sees_every_zone=True),
    "own-zone": planned(sees_every_zone=False),
}
RANDOMIZED = "wait-for-spot-randomized"

"""Which zone's spot to use, and when to wait for spot instead of paying for on-demand, under a deadline.

Uniform Progress (planning/deadline.py) buys on-demand whenever the run falls behind the uniform
line with no spot to be had: early in a run, with most of the slack still unspent, that buys hours
of on-demand that waiting would have saved. Scored on the published AWS traces (bench/spot_bench.py),
the least cost that meets the deadline (the hindsight optimum) uses on-demand only where spot is out
for longer than the slack left can absorb. This policy spends the slack on waiting instead, keeping
back only what the rest of the run is expected to need:

1. Commit (the guarantee, from `decide`): once the slack is within one restart and one tick, run on
   on-demand to the end. A tick costs at most one tick of slack, so this always comes in time.
2. Zones: each zone's spot capacity alternates between up and down spells. `ZoneModel` keeps a
   Bayesian estimate of the mean length of each zone's up spells (exponential spells, a conjugate
   Gamma prior: a prior spell of `prior_up_s`, updated with every spell seen, the running one as a
   censored observation). A machine stays where it runs while its zone has capacity (moving is a
   restart); otherwise it goes to the zone with capacity whose running up spell should last longest:
   its learned mean, or its age if longer (the traces' spells are heavy-tailed).
3. The reserve: every preemption costs one restart of slack. Over the time left, a machine on the
   best zone expects time_left / mean_up preemptions; the reserve is the commit threshold plus that
   many restarts (times `restarts_factor`).
4. With no spot in any zone: wait while the slack exceeds the reserve plus the price of an outage
   spent on on-demand (its start, the return to spot, one tick); below that, run on on-demand.
   `wait_for_spot` is this rule, and the one place it is written: the trace replay
   (`SpotDeadlinePolicy.choose`) and the fleet's deadline policy (planning/deadline.py's
   `decide`, run by `orch watch --deadline` and by the simulator's fleet) both call it.
5. On on-demand with spot back: return to spot once the slack after the restart is above the
   reserve; otherwise stay (a return that the next preemption would undo costs two restarts).
6. Randomized (opt-in: `orch simulate --randomize`, `orch watch --deadline ... --randomize`): the
   reserve's multiplier is drawn once per job (`draw_restarts_factor`) instead of fixed. Rules 4
   and 5 are a ski rental (wait = rent with slack, on-demand = buy): any fixed threshold can be
   exploited by a trace whose spot comes back the tick after the policy paid for on-demand and
   vanishes the tick after it returned, which costs a deterministic policy up to the price ratio K
   times the optimum (ROSS, arXiv 2601.14612, proves Omega(K) for every deterministic policy and
   sqrt(K) with randomization). A threshold the trace cannot know undoes that. The commit (rule 1)
   is not drawn: the guarantee stays deterministic.

Slack, everywhere here: the time left, less the work left at the pace the job (or fleet) runs at
with spot, less one start-up (the one a machine waiting for spot needs once capacity is back).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

Market = Literal["none", "spot", "on-demand"]

#: A zone's mean up spell before anything is seen (ZoneModel's prior).
PRIOR_UP_S = 3600.0
#: Share of the expected restarts the reserve keeps slack for (tune half: 0.75; 1.5 saved a third less).
RESTARTS_FACTOR = 0.75


@dataclass
class ZoneSpells:
    """What is known of one zone's spot capacity: from a trace tick by tick (`ZoneModel.observe`), or
    from a real fleet's launches and preemptions (planning/zone_steering.py)."""

    up: bool = True
    spell_s: float = 0.0  # length of the running spell
    up_s: float = 0.0  # time seen up, ended spells and the running one
    up_spells: float = 0  # up spells seen to their end (preemptions); fractional for older evidence


@dataclass
class ZoneModel:
    """Each zone's up spells learned from the capacity seen so far (rule 2 of the module docstring)."""

    #: A zone's mean up spell before anything is seen, and how many spells that guess counts for
    #: (set on the tune half of the traces: 0.5-1 h and 0.6-0.75 restarts scored alike, 3-6 h worse).
    prior_up_s: float = PRIOR_UP_S
    prior_spells: float = 1.0
    zones: list[ZoneSpells] = field(default_factory=list)

    def observe(self, up: tuple[bool, ...], tick_s: float) -> None:
        """One tick's capacity per zone."""
        if not self.zones:
            self.zones = [ZoneSpells(up=u) for u in up]
        for zone, now in zip(self.zones, up, strict=True):
            if zone.up and not now:
                zone.up_spells += 1
            if zone.up != now:
                zone.up, zone.spell_s = now, 0.0
            zone.spell_s += tick_s
            if now:
                zone.up_s += tick_s

    def mean_up_s(self, zone: int) -> float:
        """Posterior mean of the zone's up-spell length (Gamma-exponential, the running spell censored)."""
        z = self.zones[zone]
        return (self.prior_spells * self.prior_up_s + z.up_s) / (self.prior_spells + z.up_spells)

    def remaining_up_s(self, zone: int) -> float:
        """Expected rest of the zone's running up spell. The traces' spells are heavy-tailed (the longer
        one has lasted, the longer it goes on: about its own age again, as a Pareto tail of index 2
        gives), so never less than its age; and never less than the learned mean."""
        return max(self.mean_up_s(zone), self.zones[zone].spell_s if self.zones[zone].up else 0.0)

    def longest_up_s(self) -> float:
        return max(self.mean_up_s(z) for z in range(len(self.zones)))

    def ranking(self) -> list[int]:
        """Every zone, the longest expected rest of an up spell first; ties keep the listed order."""
        return sorted(range(len(self.zones)), key=lambda z: -self.remaining_up_s(z))

    def best(self, up: tuple[bool, ...]) -> int:
        """The zone with capacity whose up spells are expected to last longest."""
        return max((i for i, u in enumerate(up) if u), key=self.remaining_up_s)


def draw_restarts_factor(seed: str, mean: float = RESTARTS_FACTOR) -> float:
    """Rule 6: one job's reserve multiplier, reproducible from `seed` (the trace, or the run's name).

    x is drawn from the ski-rental density e^x / (e - 1) on [0, 1] (the optimal randomized rule for
    when to stop renting: mostly late), and the multiplier is proportional to 1 - x (a small
    multiplier waits long), scaled so that its mean is `mean`, the tuned deterministic value:
    between 0 (wait down to the commit threshold) and about 2.4 x mean."""
    x = math.log1p(random.Random(seed).random() * (math.e - 1))  # the inverse of (e^x - 1) / (e - 1)
    return mean * (1 - x) * (math.e - 1) / (math.e - 2)  # E[1 - x] = (e - 2) / (e - 1)


def reserve_s(
    time_left_s: float, overhead_s: float, tick_s: float, mean_up_s: float, restarts_factor: float = RESTARTS_FACTOR
) -> float:
    """Rule 3: the commit threshold (one restart and one tick) plus the restarts the time left is expected to cost."""
    expected_restarts = time_left_s / max(mean_up_s, tick_s)
    return overhead_s + tick_s + restarts_factor * expected_restarts * overhead_s


@dataclass(frozen=True)
class SpotWait:
    """Rule 4's verdict with no spot to be had: wait, or pay for on-demand; with the numbers that decided."""

    wait: bool
    slack_s: float
    reserve_s: float  # the slack waiting keeps back: rule 3's reserve, an on-demand start and a tick

    @property
    def reason(self) -> str:
        slack, reserve = _hours(self.slack_s), _hours(self.reserve_s)
        if self.wait:
            return f"waiting for spot: slack {slack} > reserve {reserve}"
        return f"on-demand: slack {slack} within reserve {reserve}"


def wait_for_spot(
    *,
    slack_s: float,
    time_left_s: float,
    overhead_s: float,
    tick_s: float,
    mean_up_s: float,
    restarts_factor: float = RESTARTS_FACTOR,
) -> SpotWait:
    """Rule 4: with no spot capacity, wait while the slack (module docstring) exceeds the reserve for the
    restarts to come (`reserve_s`, over the zones' learned mean up spell) plus the price of spending the
    outage on on-demand after all: its start and one tick, and the tick this decision lasts.

    Waiting costs at most one tick of slack a tick, and the commit rule takes over within one restart
    and one tick: a deadline on-demand can still make is never lost by waiting."""
    reserve = reserve_s(time_left_s, overhead_s, tick_s, mean_up_s, restarts_factor) + overhead_s + 2 * tick_s
    return SpotWait(slack_s > reserve, slack_s, reserve)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if abs(seconds) >= 5400 else f"{seconds / 60:.0f} min"


@dataclass
class SpotDeadlinePolicy:
    """Rules 1, 3, 4 and 5 of the module docstring, on top of the zone model."""

    zones: ZoneModel
    restarts_factor: float = RESTARTS_FACTOR

    def choose(
        self,
        *,
        slack_s: float,
        time_left_s: float,
        running: Market,
        zone: int,
        up: tuple[bool, ...],
        overhead_s: float,
        tick_s: float,
        committed: bool,
    ) -> tuple[Market, int]:
        """Where the job runs this tick: ("spot", zone), ("on-demand", 0) or ("none", 0)."""
        if committed:
            return "on-demand", 0
        if running == "spot" and up[zone]:
            return "spot", zone
        if any(up):
            best = self.zones.best(up)
            reserve = reserve_s(time_left_s, overhead_s, tick_s, self.zones.mean_up_s(best), self.restarts_factor)
            if running != "on-demand" or slack_s > reserve:
                return "spot", best
            return "on-demand", 0
        if running == "on-demand":
            return "on-demand", 0
        wait = wait_for_spot(
            slack_s=slack_s,
            time_left_s=time_left_s,
            overhead_s=overhead_s,
            tick_s=tick_s,
            mean_up_s=self.zones.longest_up_s(),
            restarts_factor=self.restarts_factor,
        )
        return ("none", 0) if wait.wait else ("on-demand", 0)

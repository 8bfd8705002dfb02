"""Which of `resources.zones` a spot worker should try first: the zones ranked from what they did.

The ranking is ZoneModel's (planning/spot_zones.py, the policy scored on the published traces):
each zone's up spells are exponential with an unknown mean, a Gamma prior updated with the spells
seen; a zone where one of our machines is up now is expected to stay up at least as long again as
it has (the traces' spells are heavy-tailed). What it learns from, per zone (zones.json):
1. this run's spells: machine-time up (running spells counted to now) and preemptions;
2. earlier runs in the same store, counted at `EARLIER_RUNS_WEIGHT`: capacity drifts over days,
   so an older run's evidence is worth less than this run's, and a new run still explores;
3. time to capacity: each zone's expected up spell is net of the mean time its launches waited,
   the time lost to each launch there.
A zone that nothing is known of ranks by the prior (an hour): ahead of a zone seen preempted more
often than hourly, behind one seen up for longer.

The order becomes the rendered task's `ordered` candidates (backends/skypilot_render.py): spot in
each zone, best first, then on-demand. SkyPilot takes the first with capacity, and recovers a
preempted job through the same list; orch's own launches (relaunches, the deadline policy's
workers) render the ranking as it is when they launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.core.context import RunContext
from orchestrator.core.errors import CorruptRecord
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ZoneHistory, read_zone_history
from orchestrator.core.records.run import run_names
from orchestrator.planning.spot_zones import PRIOR_UP_S, ZoneModel, ZoneSpells

#: How much an earlier run's spell counts against one of this run.
EARLIER_RUNS_WEIGHT = 0.5


@dataclass(frozen=True)
class RankedZone:
    place: str
    expected_up_s: float  # the rest of an up spell there, net of the wait for capacity
    preemptions: float  # seen there (earlier runs weighted)
    up_h: float  # machine-hours seen up there (earlier runs weighted)
    mean_wait_s: float | None  # time to capacity, when any launch got some there
    mean_up_s: float = PRIOR_UP_S  # the zone's learned mean up spell (ZoneModel.mean_up_s)

    def why(self) -> str:
        wait = f", capacity in {self.mean_wait_s / 60:.0f} min" if self.mean_wait_s is not None else ""
        seen = f"{self.preemptions:g} preemption(s) in {self.up_h:.1f} h up" if self.up_h else "nothing seen yet"
        return f"{self.place}: up spell ~{self.expected_up_s / 3600:.1f} h expected ({seen}{wait})"


def _covers(zone: str, place: str) -> bool:
    """`aws/us-east-1` covers `aws/us-east-1/us-east-1a`: a region written in the spec learns from its zones."""
    want, got = zone.lower().split("/"), place.lower().split("/")
    return got[: len(want)] == want


def rank_zones(
    zones: Sequence[str], history: ZoneHistory, earlier: Sequence[ZoneHistory], now: float, model: ZoneModel
) -> list[RankedZone]:
    """`zones` best first (ties: as listed), from this run's history and earlier runs'."""
    spells, waits = [], []
    for zone in zones:
        s, waited, wait_s = ZoneSpells(up=False), 0.0, 0.0
        for weight, h in [(1.0, history), *((EARLIER_RUNS_WEIGHT, e) for e in earlier)]:
            for place, tally in h.zones.items():
                if _covers(zone, place):
                    s.up_s += weight * tally.up_s
                    s.up_spells += weight * tally.preemptions
                    waited += weight * tally.waits
                    wait_s += weight * tally.wait_s
        for watch in history.jobs.values():  # spells running now: time up so far, censored
            if watch.up_since is not None and watch.place is not None and _covers(zone, watch.place):
                s.up, s.spell_s = True, max(s.spell_s, now - watch.up_since)
                s.up_s += now - watch.up_since
        spells.append(s)
        waits.append(wait_s / waited if waited else None)
    model.zones = spells
    ranked = [
        RankedZone(
            zone,
            model.remaining_up_s(i) - (waits[i] or 0.0),
            spells[i].up_spells,
            spells[i].up_s / 3600,
            waits[i],
            model.mean_up_s(i),
        )
        for i, zone in enumerate(zones)
    ]
    return sorted(ranked, key=lambda r: -r.expected_up_s)


def earlier_histories(ctx: RunContext) -> list[ZoneHistory]:
    """The zone histories of the store's other runs (one listing per run, one read per history)."""
    out = []
    for name in run_names(ctx.store):
        if name != ctx.layout.run:
            try:
                history = read_zone_history(ctx.store, RunLayout(name))
            except CorruptRecord:
                continue  # another run's damaged record must not stop this run's launch
            if history.zones:
                out.append(history)
    return out


def zone_order(ctx: RunContext, now: float, earlier: Sequence[ZoneHistory] | None = None) -> list[RankedZone]:
    """The spec's zones ranked for a launch now; empty when the spec names none."""
    zones = ctx.spec.resources.zones
    if not zones:
        return []
    earlier = earlier_histories(ctx) if earlier is None else earlier
    return rank_zones(zones, read_zone_history(ctx.store, ctx.layout), earlier, now, ZoneModel())


def learned_up_s(ctx: RunContext, now: float, order: Sequence[RankedZone]) -> float:
    """The longest mean up spell learned among the zones a spot worker may go to: what one waiting for
    capacity can hope for once it has some (the deadline policy's reserve, planning/spot_zones.py).
    Without `resources.zones`, the places this run's spot jobs have been to; the prior if none."""
    if not order:
        history = read_zone_history(ctx.store, ctx.layout)
        order = rank_zones(sorted(history.zones), history, [], now, ZoneModel())
    return max((r.mean_up_s for r in order), default=PRIOR_UP_S)


def describe(order: Sequence[RankedZone]) -> str:
    """The order in words: the first zone and why, then the rest."""
    if not order:
        return ""
    rest = f"; then {', '.join(r.place for r in order[1:])}" if len(order) > 1 else ""
    return f"zone {order[0].why()}{rest}"

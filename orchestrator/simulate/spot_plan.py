"""Plans one job's ticks under a deadline: a dynamic program over its slack, what runs and the spot spell it is in.

Waiting for spot spends slack; so does every restart. The hindsight optimum spends its slack where
it saves most: it waits out short outages, rides long spot spells and stays on on-demand through
flickering ones. A policy that cannot see the future can still weigh those choices by their odds,
if it has a model of how long spells last. Here:

1. Spells: spot capacity alternates between up and down spells whose hazard falls with their age
   (the traces' spells are heavy-tailed: one that has lasted an hour is likely to last another).
   `SpellPrior` gives that hazard before anything is seen, a Lomax rate `rate_h / (age0_h + age)`
   per hour; `SpellFit` scales it, up and down apart, to the spells the job has seen end (maximum
   likelihood over a grid of factors, a log-normal prior pulling towards 1), so a scarce zone and a
   plentiful one get their own odds after a few spells.
2. States: the ticks left, the slack (time left less work left, in bins; it only falls: by a whole
   tick when nothing runs, by the part of a tick a start-up eats), what runs (nothing, on-demand or
   spot, with the ticks its start-up has had) and the spell (up or down, its age in buckets).
3. The program: each state's least expected cost to the end, on-demand billed 1 a tick and spot
   `spot_share` (the price ratio); a spot machine is lost when its spell ends; a state that cannot
   finish by the deadline costs `INFEASIBLE`. Slack shifts that fall between two bins are split
   between them in proportion, so the expected slack is exact.
4. Tables: the program is solved once per job and pair of fitted factors and cached (`plan_table`):
   a fresh policy per trace reuses the tables earlier traces of the same job needed, and a
   table depends only on the job and the model, never on a trace.

The rules that keep a deadline (the commit to on-demand, the guard on launching spot) are the
policies' (spot_policies.py): the program decides only among moves that keep the deadline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.simulate.spot_replay import Market, tick_work
from orchestrator.simulate.spot_traces import ON_DEMAND_USD_H, SPOT_USD_H

H = 3600.0
#: A state that cannot finish by the deadline (finite, so that blending two bins stays ordered).
INFEASIBLE = 1e9
#: Spell ages in ticks where each bucket starts; the last bucket holds every older spell.
AGE_BUCKETS = (1, 2, 3, 5, 9, 17)
#: Slack bins per table, at least: the program's resolution (a table is ticks x spell states x markets x bins).
SLACK_BINS = 64
#: ... and more where the slack is long in ticks, so that no bin is wider than this many ticks: a
#: decision turns on slack shifts of a tick or a restart, which a wider bin blurs (195 s ticks: 64
#: bins are 3.5 ticks wide at 36 h and 6.9 at 48 h). Tune half, zone-aware below UP failover over
#: the multi-zone variants: 2.3% uncapped, 2.7% at 2.5 ticks, 2.8% at 2.0 and 1.5 (docs/BENCHMARKS.md).
MAX_BIN_TICKS = 1.5
#: The factors a fit chooses among (powers of 2 from 1/4 to 4), and its prior's spread (log2). A
#: coarse grid keeps the tables one job needs few: 25 pairs at most. The spread: a factor moves off
#: 1 only on strong evidence; a job sees few spells end, and a fit that followed them closely cost
#: more. Tune half, zone-aware below UP, spread 1.0 -> 0.5: single zone 52 h/0.02 h 7.60 -> 8.03%,
#: 70 h/0.02 h 5.92 -> 6.65%, 52 h/0.20 h 4.85 -> 5.25%, 70 h/0.20 h 3.25 -> 4.15%; multi-zone
#: 2.83 -> 2.78% (own-zone below UP round robin 9.35 -> 9.30%), ADRS setting 5.75 -> 5.78% (15.20
#: -> 14.96%) (docs/BENCHMARKS.md, spot traces).
SCALES = tuple(2.0**i for i in range(-2, 3))
SCALE_PRIOR_SD = 0.5
MARKETS: tuple[Market, ...] = ("none", "on-demand", "spot")


@dataclass(frozen=True)
class SpellPrior:
    """The hazard of a spot spell before anything is seen: `rate_h / (age0_h + age)` per hour of age,
    up spells and down spells apart (set on the tune half of the traces)."""

    up_rate_h: float = 1.1
    up_age0_h: float = 0.4
    down_rate_h: float = 1.1
    down_age0_h: float = 0.3

    def rate(self, up: bool, age_s: float) -> float:
        """Per second, at a spell age of `age_s`."""
        rate_h, age0_h = (self.up_rate_h, self.up_age0_h) if up else (self.down_rate_h, self.down_age0_h)
        return rate_h / (age0_h * H + age_s)


#: The prior every planned policy starts from.
SPELL_PRIOR = SpellPrior()


@dataclass
class SpellFit:
    """The factor on a prior hazard that best explains the spells seen end (rule 1 of the module docstring)."""

    prior: SpellPrior
    up: bool
    tick_s: float
    scale: float = 1.0
    #: Per factor of SCALES, the log-likelihood of the spells ended so far, its prior included.
    log_likelihood: list[float] = field(
        default_factory=lambda: [-(math.log2(s) ** 2) / (2 * SCALE_PRIOR_SD**2) for s in SCALES]
    )

    def end(self, ticks: int) -> None:
        """A spell of `ticks` ticks has ended: it survived each of its ticks but the last."""
        for i, scale in enumerate(SCALES):
            survived = sum(math.log1p(-self._hazard(scale, age)) for age in range(1, ticks))
            self.log_likelihood[i] += survived + math.log(self._hazard(scale, ticks))
        self.scale = SCALES[max(range(len(SCALES)), key=self.log_likelihood.__getitem__)]

    def _hazard(self, scale: float, age_ticks: float) -> float:
        return -math.expm1(-scale * self.tick_s * self.prior.rate(self.up, (age_ticks - 0.5) * self.tick_s))


@dataclass(frozen=True)
class Table:
    """A solved program: `act[t][spell, market, bin]` is an index into MARKETS."""

    act: Any  # numpy int8 array (ticks, spell states, markets, bins)
    bin_s: float
    phases: int

    def market(self, tick: int, up: bool, age_ticks: int, running: Market, ticks_on: int, slack_s: float) -> Market:
        bucket = sum(1 for start in AGE_BUCKETS if age_ticks >= start) - 1
        spell = bucket if up else len(AGE_BUCKETS) + bucket
        phase = min(ticks_on, self.phases - 1)
        market = 0 if running == "none" else (1 + phase if running == "on-demand" else 1 + self.phases + phase)
        slack_bin = min(max(int(slack_s // self.bin_s), 0), self.act.shape[3] - 1)
        return MARKETS[int(self.act[tick, spell, market, slack_bin])]


def bucket_hazards(prior: SpellPrior, up: bool, scale: float, tick_s: float) -> tuple[float, ...]:
    """Per bucket of AGE_BUCKETS, the chance a spell ends in its next tick (at the bucket's middle age)."""
    ends = (*AGE_BUCKETS[1:], 2 * AGE_BUCKETS[-1])
    return tuple(
        -math.expm1(-scale * tick_s * prior.rate(up, (start + end - 1) / 2 * tick_s))
        for start, end in zip(AGE_BUCKETS, ends, strict=True)
    )


@functools.lru_cache(maxsize=32)
def plan_table(
    ticks: int,
    tick_s: float,
    work_s: float,
    overhead_s: float,
    up_hazards: tuple[float, ...],
    down_hazards: tuple[float, ...],
    spot_share: float = SPOT_USD_H / ON_DEMAND_USD_H,
) -> Table:
    """The program (rules 2-3 of the module docstring) for a job of `work_s` due in `ticks` ticks."""
    import numpy as np

    buckets = len(AGE_BUCKETS)
    spells = 2 * buckets  # up buckets, then down buckets
    move = np.zeros((spells, spells))  # the spell's chances a tick later
    for b, (start, end) in enumerate(zip(AGE_BUCKETS, (*AGE_BUCKETS[1:], math.inf), strict=True)):
        older = 1 / (end - start) if end != math.inf else 0.0  # the chance its age leaves the bucket
        for offset, hazard, other in ((0, up_hazards[b], buckets), (buckets, down_hazards[b], 0)):
            move[offset + b, offset + min(b + 1, buckets - 1)] += (1 - hazard) * older
            move[offset + b, offset + b] += (1 - hazard) * (1 - older)
            move[offset + b, other] += hazard
    up = np.arange(spells) < buckets
    phases = math.ceil(overhead_s / tick_s) + 1 if overhead_s else 1
    gains = [tick_work(p, tick_s, overhead_s) for p in range(phases)]
    # What a market's next tick does: a new machine (class 0) or one in phase p (class 1 + p).
    gain = [gains[0], *gains]
    after = [min(1, phases - 1), *(min(p + 1, phases - 1) for p in range(phases))]
    markets = 1 + 2 * phases  # nothing, on-demand in each phase, spot in each phase
    on_demand_class = np.array([0, *(1 + p for p in range(phases)), *([0] * phases)])
    spot_class = np.array([0, *([0] * phases), *(1 + p for p in range(phases))])
    spot_rows = [1 + phases + p for p in range(phases)]

    total_slack = ticks * tick_s - work_s
    bin_s = max(min(total_slack / SLACK_BINS, MAX_BIN_TICKS * tick_s), 1.0)
    bins = int(total_slack // bin_s) + 1
    slack = np.arange(bins) * bin_s

    def shifted(values: Any, lost_s: float) -> Any:
        """values at the slack `lost_s` lower, split between the two bins around it (rule 3)."""
        low, part = divmod(lost_s / bin_s, 1.0)
        low = int(low)
        out = np.full_like(values, INFEASIBLE)
        if low < bins:
            out[..., low:] = values[..., : bins - low]
        if part > 1e-9:
            higher = np.full_like(values, INFEASIBLE)
            if low + 1 < bins:
                higher[..., low + 1 :] = values[..., : bins - low - 1]
            out = (1 - part) * out + part * higher
        return np.minimum(out, INFEASIBLE)

    value = np.full((spells, markets, bins), INFEASIBLE)
    act = np.zeros((ticks, spells, markets, bins), dtype=np.int8)
    for t in range(ticks - 1, -1, -1):
        work_left = (ticks - t) * tick_s - slack
        expected = np.tensordot(move, value, axes=([1], [0]))
        # A spot machine goes on only if its spell does; otherwise nothing runs the next tick.
        kept = np.where(up[:, None, None], value[:, spot_rows, :], value[:, [0], :])
        spot_expected = np.tensordot(move, kept, axes=([1], [0]))
        on_demand_q = np.empty((phases + 1, spells, bins))
        spot_q = np.empty((phases + 1, spells, bins))
        for c in range(phases + 1):
            done = (work_left - gain[c] <= 1e-6)[None, :]
            lost = tick_s - gain[c]
            on_demand_q[c] = np.where(done, 1.0, shifted(expected[:, 1 + after[c], :], lost) + 1.0)
            spot_q[c] = np.where(done, spot_share, shifted(spot_expected[:, after[c], :], lost) + spot_share)
        spot_q[:, ~up, :] = np.inf  # no spot machine where there is no capacity
        q = np.empty((3, spells, markets, bins))
        q[0] = shifted(expected[:, 0, :], tick_s)[:, None, :]
        q[1] = on_demand_q[on_demand_class].transpose(1, 0, 2)
        q[2] = spot_q[spot_class].transpose(1, 0, 2)
        act[t] = np.argmin(q, axis=0)
        value = q.min(axis=0)
    return Table(act, bin_s, phases)


@dataclass
class SpellWatch:
    """The capacity a policy sees, tick by tick: the running spell's age and the fits of ended spells."""

    prior: SpellPrior
    tick_s: float
    up: bool | None = None
    age: int = 0
    fits: dict[bool, SpellFit] = field(default_factory=dict)

    def see(self, up: bool) -> None:
        if up == self.up:
            self.age += 1
            return
        if self.up is not None:
            self._fit(self.up).end(self.age)
        self.up, self.age = up, 1

    def arrive(self, up: bool, age: int) -> None:
        """A look at a zone not watched before: its spell began unseen, so nothing ends in the fits and the
        spell is taken to be `age` ticks old."""
        self.up, self.age = up, age

    def _fit(self, up: bool) -> SpellFit:
        return self.fits.setdefault(up, SpellFit(self.prior, up, self.tick_s))

    def hazards(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return (
            bucket_hazards(self.prior, True, self._fit(True).scale, self.tick_s),
            bucket_hazards(self.prior, False, self._fit(False).scale, self.tick_s),
        )


def plan(watch: SpellWatch, ticks: int, work_s: float, overhead_s: float) -> Table:
    """The table for the job under the spells `watch` has seen."""
    up_hazards, down_hazards = watch.hazards()
    return plan_table(ticks, watch.tick_s, work_s, overhead_s, up_hazards, down_hazards)

"""Scores spot/deadline policies on the published traces: missed deadlines, cost against on-demand, against
the published Uniform Progress and against the hindsight optimum, per benchmark variant and in total.

Every policy replays the same jobs over the same traces (`spot_replay`) under one cost model (orch's,
or the published benchmark's: `spot_traces.CostModel`); the optimum of each is computed exactly
(`spot_optimum`) under the same model. Each setting's traces are split in two halves, scored apart:
"tune" (the first half of each zone's traces, the only ones a policy's knobs may be set on) and
"held-out" (the rest).
- multi-zone: the benchmark's 10 scenarios x traces 0..7 (tune 0..3, held-out 4..7), in 8 variants:
  the scenarios' availability label (high/low) x deadline 36/48 h x restart 0.05/0.20 h, 24 h jobs.
- single-zone: 48 h jobs, deadline 52 or 70 h, restart 0.02 or 0.20 h, 30 traces of each of six
  (zone, machine) environments (tune: the first 15 of each). Its halves are not independent: an
  environment's traces are windows of one 12-day trace, and the held-out windows replay ticks the
  tune ones cover (docs/BENCHMARKS.md, spot traces); the multi-zone traces are disjoint periods.
- adrs-multi-zone: the setting ADRS evolved its multi-region policies on (48 h jobs, deadline 52 h,
  restart 0.20 h, the high-availability scenarios, traces 0..7; tune 0..3).

Measures, per group of runs: `missed_deadlines` (count), `cost_vs_on_demand` (mean of each run's
cost over on-demand's), `gap_to_optimum` (mean cost / the optimum's mean cost - 1) and savings,
each 1 - mean cost / a baseline's mean cost on the same runs (`spot_baselines`):
`saving_vs_up` against the paper's Uniform Progress with failover across zones (it sees every
zone), `saving_vs_up_round_robin` against its round-robin form (it sees its own zone only, the
published multi-region baseline) and `saving_vs_up_one_zone` against it on the first zone listed.
In one zone the three are the same rule.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.simulate import spot_traces as st
from orchestrator.simulate.spot_optimum import optimum_costs
from orchestrator.simulate.spot_replay import PolicyFactory, deadline_ticks, on_demand_cost, replay

T = TypeVar("T")

BASELINE = "uniform-progress"
#: Each saving's key and the baseline it is quoted against (module docstring).
SAVINGS = {
    "saving_vs_up": BASELINE,
    "saving_vs_up_round_robin": "uniform-progress-round-robin",
    "saving_vs_up_one_zone": "uniform-progress-one-zone",
}
HALVES = ("tune", "held-out")
#: The settings scored, in the order they are reported.
SETTINGS = ("multi-zone", "single-zone", "adrs-multi-zone")
#: The ADRS evolution setting on the multi-zone traces.
ADRS_WORK_H, ADRS_DEADLINE_H, ADRS_OVERHEAD_H = 48.0, 52.0, 0.20


@dataclass(frozen=True)
class Grid:
    """What to score: `quick` (one restart overhead, 6 single-zone traces per environment), `smoke`
    (the least that still runs every setting, policy and half: one deadline and restart overhead,
    one scenario per availability label, one single-zone environment, one trace per half), `draws`
    (policies replayed that many times per run, each with its own seed) and the cost model."""

    quick: bool = False
    smoke: bool = False
    draws: Mapping[str, int] | None = None
    costs: st.CostModel = st.ORCH_COSTS

    def one_if_smoke(self, values: Sequence[T], keep: int = 0) -> Sequence[T]:
        """`values` whole, or (smoke) only the one at `keep`."""
        return [values[keep]] if self.smoke else values

    def multi_traces(self) -> list[int]:
        """The multi-zone trace numbers scored: all, or (smoke) the first of each half."""
        half = len(st.MULTI_TRACES) // 2
        return [0, half] if self.smoke else list(st.MULTI_TRACES)

    def scenarios(self, availability: str | None = None) -> list[st.Scenario]:
        """The multi-zone scenarios scored (of one availability label if named): smoke, the first of each label."""
        chosen = [s for s in st.SCENARIOS if availability in (None, s.availability)]
        return [s for s in chosen if s.name.endswith("-1")] if self.smoke else chosen


@dataclass
class Run:
    """One job over one trace: every policy's cost and punctuality, on-demand's cost and the optimum."""

    setting: str  # "multi-zone" or "single-zone"
    variant: str
    half: str
    trace: str
    on_demand: float
    optimum: float
    cost: dict[str, float]
    met: dict[str, bool]


def _runs_for(
    setting: str,
    variant: str,
    job: st.Job,
    traces: list[st.Trace],
    halves: list[str],
    policies: Mapping[str, PolicyFactory],
    grid: Grid,
) -> list[Run]:
    optimum = optimum_costs(job, traces, grid.costs)
    out = []
    for trace, half, best in zip(traces, halves, optimum, strict=True):
        cost, met = {}, {}
        for name, make in policies.items():
            seeds = [f"{variant}/{trace.name}/{i}" for i in range((grid.draws or {}).get(name, 1))]
            outcomes = [replay(job, trace, make(seed), grid.costs) for seed in seeds]
            cost[name] = statistics.fmean(o.cost_usd for o in outcomes)
            met[name] = all(o.met for o in outcomes)
        on_demand = on_demand_cost(job, trace.gap_s, grid.costs)
        out.append(Run(setting, variant, half, trace.name, on_demand, best, cost, met))
    return out


def _scenario_traces(root: Path, scenarios: Iterable[st.Scenario], grid: Grid) -> dict[str, list[st.Trace]]:
    return {s.name: [st.multi_zone_trace(root, s.zones, k) for k in grid.multi_traces()] for s in scenarios}


def _multi_halves(grid: Grid) -> list[str]:
    return ["tune" if k < len(st.MULTI_TRACES) // 2 else "held-out" for k in grid.multi_traces()]


def multi_zone_runs(root: Path, policies: Mapping[str, PolicyFactory], grid: Grid = Grid()) -> list[Run]:
    runs: list[Run] = []
    traces_of = _scenario_traces(root, grid.scenarios(), grid)
    for deadline_h in grid.one_if_smoke(st.MULTI_DEADLINES_H):
        for overhead_h in st.MULTI_OVERHEADS_H[:1] if grid.quick or grid.smoke else st.MULTI_OVERHEADS_H:
            job = st.Job(st.MULTI_WORK_H * st.H, deadline_h * st.H, overhead_h * st.H)
            for scenario in grid.scenarios():
                variant = f"{scenario.availability}/{deadline_h:g}h/{overhead_h:g}h"
                traces = traces_of[scenario.name]
                runs += _runs_for("multi-zone", variant, job, traces, _multi_halves(grid), policies, grid)
    return runs


def adrs_runs(root: Path, policies: Mapping[str, PolicyFactory], grid: Grid = Grid()) -> list[Run]:
    """The ADRS evolution setting (module docstring) on the high-availability scenarios."""
    runs: list[Run] = []
    high = grid.scenarios("high")
    job = st.Job(ADRS_WORK_H * st.H, ADRS_DEADLINE_H * st.H, ADRS_OVERHEAD_H * st.H)
    variant = f"high/{ADRS_DEADLINE_H:g}h/{ADRS_OVERHEAD_H:g}h, {ADRS_WORK_H:g} h job"
    for traces in _scenario_traces(root, high, grid).values():
        runs += _runs_for("adrs-multi-zone", variant, job, traces, _multi_halves(grid), policies, grid)
    return runs


def single_zone_runs(root: Path, policies: Mapping[str, PolicyFactory], grid: Grid = Grid()) -> list[Run]:
    runs: list[Run] = []
    count = 2 if grid.smoke else 6 if grid.quick else st.SINGLE_TRACES
    for deadline_h in grid.one_if_smoke(st.SINGLE_DEADLINES_H):
        traces, halves = [], []
        for env in grid.one_if_smoke(st.SINGLE_ENVS):
            some = st.single_zone_traces(root, env, max(st.SINGLE_DEADLINES_H), count)
            traces += some
            halves += ["tune" if i < len(some) // 2 else "held-out" for i in range(len(some))]
        for overhead_h in grid.one_if_smoke(st.SINGLE_OVERHEADS_H, keep=-1):
            job = st.Job(st.SINGLE_WORK_H * st.H, deadline_h * st.H, overhead_h * st.H)
            variant = f"{deadline_h:g}h/{overhead_h:g}h"
            runs += _runs_for("single-zone", variant, job, traces, halves, policies, grid)
    return runs


def measures(runs: list[Run], policy: str) -> dict[str, Any]:
    """The four measures of one policy over a group of runs."""
    mean_cost = statistics.fmean(r.cost[policy] for r in runs)
    out: dict[str, Any] = {
        "runs": len(runs),
        "missed_deadlines": sum(not r.met[policy] for r in runs),
        "cost_vs_on_demand": statistics.fmean(r.cost[policy] / r.on_demand for r in runs),
        "gap_to_optimum": mean_cost / statistics.fmean(r.optimum for r in runs) - 1,
    }
    for key, baseline in SAVINGS.items():
        if baseline in runs[0].cost:
            out[key] = 1 - mean_cost / statistics.fmean(r.cost[baseline] for r in runs)
    return out


def _grouped(runs: Iterable[Run], key: Callable[[Run], str]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    return groups


def summary(runs: list[Run], policies: Iterable[str]) -> dict[str, Any]:
    """Per setting: per variant and in total, per policy, over all runs and per half; the optimum's own
    share of on-demand beside them."""
    names = list(policies)
    out: dict[str, Any] = {}
    for setting, in_setting in _grouped(runs, lambda r: r.setting).items():

        def block(group: list[Run]) -> dict[str, Any]:
            return {
                "optimum_cost_vs_on_demand": statistics.fmean(r.optimum / r.on_demand for r in group),
                "policies": {
                    n: {**measures(group, n), "halves": {h: measures(g, n) for h, g in _halves(group).items()}}
                    for n in names
                },
            }

        variants = _grouped(in_setting, lambda r: r.variant)
        out[setting] = {"variants": {v: block(g) for v, g in variants.items()}, "total": block(in_setting)}
    return out


def _halves(runs: list[Run]) -> dict[str, list[Run]]:
    groups = _grouped(runs, lambda r: r.half)
    return {h: groups[h] for h in HALVES if h in groups}


def scenario_availability(root: Path) -> dict[str, dict[str, Any]]:
    """Each multi-zone scenario's measured share of (zone, tick) with spot capacity, over its 8 traces
    and the longest deadline (the simulator's meaning: a 1 is a tick without capacity)."""
    out = {}
    for s in st.SCENARIOS:
        traces = [st.multi_zone_trace(root, s.zones, k) for k in st.MULTI_TRACES]
        limit = deadline_ticks(st.Job(0, max(st.MULTI_DEADLINES_H) * st.H, 0), traces[0].gap_s)
        up = [sum(u[:limit]) / limit for t in traces for u in t.up]
        any_up = [sum(any(col) for col in zip(*(u[:limit] for u in t.up), strict=True)) / limit for t in traces]
        out[s.name] = {
            "label": s.availability,
            "zones": list(s.zones),
            "availability": statistics.fmean(up),
            "any_zone_up": statistics.fmean(any_up),
        }
    return out


def score(root: Path, policies: Mapping[str, PolicyFactory], grid: Grid = Grid()) -> dict[str, Any]:
    """The whole benchmark: per setting, variant and policy, the measures; the scenarios' availability.
    A policy named in `grid.draws` is replayed that many times per run, each with its own seed: its
    cost is the mean (the expected cost of a randomized policy), its deadline met only if met every time."""
    st.check_layout(root)
    if BASELINE not in policies:
        raise ValueError(f"the scorer needs {BASELINE!r} among the policies: savings are quoted against it")
    runs = (
        multi_zone_runs(root, policies, grid) + single_zone_runs(root, policies, grid) + adrs_runs(root, policies, grid)
    )
    return {
        "meaning": "1 in a trace = spot NOT available in that tick (the benchmark simulator's reading)",
        "cost_model": grid.costs.name,
        "scenarios": scenario_availability(root),
        **summary(runs, policies),
    }

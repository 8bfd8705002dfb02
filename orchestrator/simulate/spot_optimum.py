"""The hindsight optimum of a job over a spot trace: the least cost that meets the deadline knowing the whole trace.

Computed exactly, by dynamic programming over (tick, work done, what runs and for how long), with
the accounting of `spot_replay` (whole ticks billed, a new machine computing nothing for its
first `overhead_s`, a zone switch a new machine):
- A machine's (i+1)-th tick computes `tick_work(i)`; from the (c+1)-th on, c = ceil(overhead / G),
  a whole tick. So each market (on-demand, spot in zone z) has c+1 states: its machine's 1st,
  2nd, ..., (c+1)-th-or-later tick; plus "nothing runs".
- Work is counted in units of u = gcd(G, every tick_work, the job's work), all in whole seconds:
  every reachable amount of work is a whole number of units, so the program is exact, not an
  approximation on a grid.
- C[state][w] = least cost to be in `state` after the tick with w units done. A launch can come
  from any state (a relaunch into the state one is in is never cheaper than staying), so each tick
  needs the minimum over all states once. Spot states of a zone without capacity in the tick are
  impossible. Reaching the whole work ends the job: its cost is a candidate for the optimum.

Under the benchmark's cost model (`CostModel`), a spot machine that survives into a tick may move
to any zone with capacity in it and keep its phase (a free move), and every spot tick is billed at
the price of the zone the job ends in: the program runs once per zone f with f's prices, counting
only jobs that end on on-demand (which may end in any zone: a move costs nothing) or on spot in f,
and the optimum is the least of those.

Vectorised with numpy over the work axis and over traces that share zones and tick length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from orchestrator.simulate.spot_replay import deadline_ticks, tick_work
from orchestrator.simulate.spot_traces import ORCH_COSTS, CostModel, H, Job, Trace


def _whole(seconds: float, what: str) -> int:
    if abs(seconds - round(seconds)) > 1e-6:
        raise ValueError(f"{what} {seconds} s is not a whole number of seconds: the program counts in whole seconds")
    return round(seconds)


def _shift(np: Any, arr: Any, g: int, top: int) -> Any:
    """arr advanced by g units of work; column `top` gathers every state that reached the whole work."""
    out = np.full_like(arr, np.inf)
    if g == 0:
        out[:, :top] = arr[:, :top]
    elif g < top:
        out[:, g:top] = arr[:, : top - g]
        out[:, top] = arr[:, top - g : top].min(axis=1)
    else:
        out[:, top] = arr[:, :top].min(axis=1)
    return out


def optimum_costs(job: Job, traces: Sequence[Trace], costs: CostModel = ORCH_COSTS) -> list[float]:
    """The least cost (USD) meeting the deadline on each trace (math.inf where none does); the traces
    must share zones and tick length (a scenario's traces do)."""
    import numpy as np

    gap_s = traces[0].gap_s
    if any(t.gap_s != gap_s or len(t.up) != len(traces[0].up) for t in traces):
        raise ValueError("optimum_costs: the traces must share zones and tick length")
    zones = len(traces[0].up)
    if not costs.final_zone_prices:
        return [float(b) for b in _least(np, job, traces, costs, np.full(len(traces), costs.spot_usd_h), None)]
    best = np.full(len(traces), np.inf)
    for final in range(zones):
        prices = np.array([costs.spot_price(t, final) for t in traces])
        best = np.minimum(best, _least(np, job, traces, costs, prices, final))
    return [float(b) for b in best]


def _least(
    np: Any, job: Job, traces: Sequence[Trace], costs: CostModel, spot_usd_h: Any, final_zone: int | None
) -> Any:
    """The program (module docstring) with a spot price per trace; with `final_zone`, only jobs ending
    on on-demand or on spot in that zone count."""
    gap_s = traces[0].gap_s
    gap, over, work = _whole(gap_s, "the tick"), _whole(job.overhead_s, "the overhead"), _whole(job.work_s, "the work")
    phases = math.ceil(over / gap) + 1 if over else 1
    gains = [round(tick_work(i, gap, over)) for i in range(phases)]
    unit = math.gcd(gap, work, *gains)
    gains_u, top = [g // unit for g in gains], work // unit
    limit = deadline_ticks(job, gap_s)
    up = np.array([[u[:limit] for u in t.up] for t in traces], dtype=bool)  # (trace, zone, tick)
    od_price = costs.on_demand_usd_h * gap / H
    spot_price = (spot_usd_h * gap / H)[:, None]

    n = len(traces)
    start = np.full((n, top + 1), np.inf)
    start[:, 0] = 0.0
    none = start
    # Running markets: on-demand, then spot per zone; each a list of phase arrays.
    markets: list[list[Any]] = [[np.full((n, top + 1), np.inf) for _ in range(phases)] for _ in range(1 + up.shape[1])]
    best = np.full(n, np.inf)
    for t in range(limit):
        any_state = none
        for states in markets:
            for arr in states:
                any_state = np.minimum(any_state, arr)
        moved = _survivors(np, markets[1:], up[:, :, t]) if costs.free_spot_moves else None
        new_markets = []
        for m, states in enumerate(markets):
            cost = od_price if m == 0 else spot_price
            # What continues into this market's phases: its own machine, or (free moves) any spot
            # machine that survived into this tick, wherever it ran.
            kept = moved if moved is not None and m > 0 else states
            entered = [any_state, *kept[: phases - 1]]
            if phases > 1:
                entered[-1] = np.minimum(entered[-1], kept[-1])  # the last phase continues into itself
            else:
                entered[0] = np.minimum(any_state, kept[0])
            new = [_shift(np, arr, gains_u[p], top) + cost for p, arr in enumerate(entered)]
            if m > 0:
                unavailable = ~up[:, m - 1, t]
                for arr in new:
                    arr[unavailable] = np.inf
            for arr in new:
                if final_zone is None or m in (0, final_zone + 1):
                    best = np.minimum(best, arr[:, top])
                arr[:, top] = np.inf
            new_markets.append(new)
        markets, none = new_markets, any_state
    return best


def _survivors(np: Any, spot: list[list[Any]], up_now: Any) -> list[Any]:
    """Per phase, the least cost of a spot machine in a zone with capacity this tick (it survives)."""
    out = []
    for p in range(len(spot[0])):
        least = np.full_like(spot[0][p], np.inf)
        for z, states in enumerate(spot):
            least = np.minimum(least, np.where(up_now[:, z : z + 1], states[p], np.inf))
        out.append(least)
    return out

"""The simulated fleet as the deadline policy sees it: the FleetState `orch watch --deadline` builds from a real run.

Spot workers are counted as the watch loop counts SkyPilot's jobs (controller/deadline_control.py):
up, or coming up on capacity already found (a restart under way); waiting for capacity (preempted
into an outage: their next start lies beyond now); and all of them together, the fleet's pace once
spot is back. With zones, the reserve's mean up spell is the ranking's (controller/zone_steering.py),
learned from the same zone history that steers the simulated spot workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.controller.deadline import FleetState, OnDemandWorker
from orchestrator.controller.spot_zones import PRIOR_UP_S, ZoneModel
from orchestrator.controller.zone_steering import rank_zones

if TYPE_CHECKING:
    from orchestrator.simulate.fleet import Fleet


def fleet_state(fleet: Fleet, now: float) -> FleetState:
    config = fleet.config
    gpus = [fleet.prices.get(g) for g in config.gpus]
    new_rate = sum(config.base_rows_per_s * g.relative_speed for g in gpus) / len(gpus) / fleet.rows_per_unit
    spot = [w for w in fleet.workers if w.spot and w.exited_at is None]
    up = [w for w in spot if w.up or (w.provisioning_since is not None and w.provisioning_since <= now)]
    mean_up_s = PRIOR_UP_S
    if fleet.zones is not None:
        ranked = rank_zones(list(config.zones), fleet.zones.history, [], now, ZoneModel())
        mean_up_s = max(r.mean_up_s for r in ranked)
    return FleetState(
        elapsed_s=now,
        total_rows=float(sum(fleet.units.values())),
        done_rows=float(fleet.units_done_now()),
        spot_rate=sum(w.rate for w in up),
        spot_waiting=len(spot) - len(up),
        spot_pace=sum(w.rate for w in spot),
        mean_up_s=mean_up_s,
        on_demand=[OnDemandWorker(w.index, w.rate, w.up) for w in fleet.workers if w.extra and w.exited_at is None],
        new_worker_rate=new_rate,
        new_worker_usd_h=sum(g.on_demand_usd_h for g in gpus) / len(gpus),
        cost_so_far_usd=fleet.cost_until(now),
        largest_chunk_rows=float(max((u for c, u in fleet.units.items() if c not in fleet.done), default=0)),
        open_chunks=len(fleet.units) - len(fleet.done) - sum(1 for w in fleet.workers if w.up and w.session),
    )

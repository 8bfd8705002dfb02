"""Spot zones in the simulated fleet, steered by the code that steers real launches.

Each zone takes a spot machine away at its own Poisson rate (SimConfig.zones). A spot worker that
(re)starts goes to the zone `rank_zones` puts first (planning/zone_steering.py), with SkyPilot's
ordered failover in mind: capacity is found in the first zone tried. What the fleet sees (a machine
up in a zone, preempted there, finished) goes into a ZoneHistory through the same transitions the
watch loop applies to SkyPilot's job records (planning/zone_history.py). With `ranked` off, every
worker takes the first zone listed, as a task rendered in the spec's order would.
"""

from __future__ import annotations

import math
import random

from orchestrator.core.records import ZoneHistory
from orchestrator.planning.spot_zones import ZoneModel
from orchestrator.planning.zone_history import ended, preempted, started
from orchestrator.planning.zone_steering import rank_zones


class FleetZones:
    def __init__(self, rates_per_hour: dict[str, float], *, ranked: bool, rng: random.Random):
        self.rates = rates_per_hour
        self.ranked = ranked
        self.rng = rng
        self.history = ZoneHistory()
        self._due: dict[int, float] = {}  # worker -> when its machine is taken away
        self._waiting_since: dict[int, float] = {}

    def arrive(self, worker: int, now: float) -> float:
        """A spot worker is up: in the best zone now. Returns when that zone takes its machine away."""
        zones = list(self.rates)
        place = rank_zones(zones, self.history, [], now, ZoneModel())[0].place if self.ranked else zones[0]
        started(self.history, str(worker), worker, place, now, since=self._waiting_since.pop(worker, now))
        rate = self.rates[place]
        self._due[worker] = now + self.rng.expovariate(rate / 3600) if rate > 0 else math.inf
        return self._due[worker]

    def due(self, worker: int, now: float) -> bool:
        """Whether a preemption event at `now` is still this worker's (not one of a machine it left)."""
        return self._due.get(worker) == now

    def leave(self, worker: int, now: float, *, by_preemption: bool) -> None:
        self._due.pop(worker, None)
        if by_preemption:
            preempted(self.history, str(worker), now)
            self._waiting_since[worker] = now
        else:
            ended(self.history, str(worker), now)

    def place_of(self, worker: int) -> str | None:
        watch = self.history.jobs.get(str(worker))
        return watch.place if watch is not None else None

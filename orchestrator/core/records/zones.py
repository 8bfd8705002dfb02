"""zones.json: what each zone did for a run's spot workers: up spells, preemptions, time to capacity.

Written by the controller's reconcile loop (planning/zone_history.py) from the backend's job
records, which say where each job runs (SkyPilot: cloud, region, zone). Read back to rank the zones
of `resources.zones` for the next launch of this run and, counted at a discount, of later runs in
the same store (planning/zone_steering.py).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field

from orchestrator.core.layout import RunLayout
from orchestrator.core.records.base import Document, Record, cas_update, read_record
from orchestrator.core.store import Store


class ZoneTally(Record):
    """One place's evidence, keyed by `cloud/region/zone` as the backend reported it (cloud lower-case)."""

    up_s: float = Field(0.0, description="machine-seconds of spot seen up there, spells that ended")
    preemptions: int = Field(0, description="up spells ended by a preemption (the job went RECOVERING)")
    ended: int = Field(0, description="up spells ended otherwise (the job finished, was cancelled or failed)")
    waits: int = Field(0, description="times a job got capacity there, after a launch or a preemption")
    wait_s: float = Field(0.0, description="their total time from the launch (or preemption) to RUNNING")


class ZoneWatch(Record):
    """A spot job being followed: where it runs and since when, or since when it waits for capacity."""

    worker: int
    place: str | None = None
    up_since: float | None = Field(None, description="when it was first seen RUNNING in `place`; None: not up")
    waiting_since: float = Field(description="launch, or the preemption it is recovering from")
    recoveries: int = Field(0, description="SkyPilot's recovery_count when last seen")


class ZoneHistory(Document):
    zones: dict[str, ZoneTally] = Field(default_factory=dict)
    #: job id -> the job followed (spot jobs that have not ended).
    jobs: dict[str, ZoneWatch] = Field(default_factory=dict)
    updated_at: float = 0.0


def read_zone_history(store: Store, layout: RunLayout) -> ZoneHistory:
    """The run's zone history (empty for a run with none)."""
    found = read_record(store, layout.zones, ZoneHistory)
    return found[0] if found is not None else ZoneHistory()


def update_zone_history(store: Store, layout: RunLayout, change: Callable[[ZoneHistory], bool]) -> ZoneHistory:
    """Change the history through `change` (True: something changed), written back by compare-and-swap."""

    def apply(history: ZoneHistory | None) -> ZoneHistory | None:
        history = history or ZoneHistory()
        return history if change(history) else None

    history, _ = cas_update(store, layout.zones, ZoneHistory, apply)
    return history or ZoneHistory()

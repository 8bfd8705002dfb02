"""How right the forecast was, as the read model shows it: the fleet's engine time, and the forecast's
band beside the pace so far (collect/forecast_actual.py keeps the actual figures in its record)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.records import Heartbeat
from orchestrator.core.records.forecast import Band, ForecastRecord
from orchestrator.core.store import Store
from orchestrator.core.worker_ids import job_worker
from orchestrator.runview.sections import ForecastCheck


def fleet_engine_s(store: Store, layout: RunLayout, leave_out: Collection[str]) -> float:
    """The fleet's engine time: the busiest worker's engine seconds (its processes added), the probes' left out."""
    per_worker: dict[str, float] = {}
    for worker, summary in read_heartbeats(store, layout).items():
        if summary.holder in leave_out:
            continue
        key = next((i.key for i in store.list(f"{layout.heartbeats_prefix}{worker}/")), None)
        if key is None:
            continue
        beat = Heartbeat.from_bytes(store.get(key).data)
        per_worker[job_worker(worker)] = per_worker.get(job_worker(worker), 0.0) + beat.busy_s
    return max(per_worker.values(), default=0.0)


def forecast_beside_pace(
    record: ForecastRecord | None, *, launched_at: float | None, eta_s: float | None, now: float, complete: bool
) -> ForecastCheck | None:
    """What `orch status` shows of the forecast: the fleet's duration band beside the finish the pace
    so far projects (time since the first launch plus the ETA), and how right it was once collected."""
    if record is None:
        return None
    fleet = record.fleet_candidate()
    if fleet is None:
        return None
    band = fleet.duration_s
    projected = now - launched_at + eta_s if launched_at is not None and eta_s is not None and not complete else None
    return ForecastCheck(
        kind=record.kind,
        duration_s=band,
        projected_s=round(projected, 1) if projected is not None else None,
        projected_in_band=_place_in(band, projected) if projected is not None else None,
        actual=dict(record.actual) if record.actual is not None else None,
    )


def _place_in(band: Band, value: float) -> Literal["below p10", "inside", "above p90"]:
    if value < band.p10:
        return "below p10"
    return "inside" if value <= band.p90 else "above p90"

"""How right the forecast was, as the read model shows it: the fleet's engine time, and the forecast's
band beside the pace so far (collect/forecast_actual.py keeps the actual figures in its record)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.records import Heartbeat
from orchestrator.core.records.forecast import ForecastRecord
from orchestrator.core.store import Store
from orchestrator.core.worker_ids import job_worker


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
) -> dict[str, Any] | None:
    """What `orch status` shows of the forecast: the fleet's duration band beside the finish the pace
    so far projects (time since the first launch plus the ETA), and how right it was once collected."""
    if record is None:
        return None
    fleet = record.fleet_candidate()
    if fleet is None:
        return None
    view: dict[str, Any] = {"kind": record.kind, "duration_s": fleet.duration_s.model_dump(), "projected_s": None}
    if launched_at is not None and eta_s is not None and not complete:
        projected = now - launched_at + eta_s
        band = fleet.duration_s
        view["projected_s"] = round(projected, 1)
        view["projected_in_band"] = (
            "below p10" if projected < band.p10 else "inside" if projected <= band.p90 else "above p90"
        )
    if record.actual is not None:
        view["actual"] = dict(record.actual)
    return view

"""One quote before paying: the forecast `orch estimate` and `orch plan --estimate` both give for a run.

1. A run of several models: each pool on its own machines (forecast_pools.py), from its probes or a
   guess, the run ending with its slowest pool.
2. A probe that measured: the bootstrapped forecast from the probe's own rows (forecast.py).
3. Otherwise a guess from what is known (forecast.guess): a speed and start-up finished chunks of
   this run or an earlier one of the same model measured (measured.py), else the price table.
Every branch counts start-up and quotes spot and on-demand as p10-p90 bands; the same run gives
the same figures from either command (the draws are seeded).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.context import RunContext
from orchestrator.core.records import ManifestEntry
from orchestrator.core.records.forecast import ForecastRecord, ProbeRecord
from orchestrator.planning.forecast import FleetSimulator, forecast_from_probes, guess
from orchestrator.planning.forecast_pools import forecast_pools
from orchestrator.planning.measured import measured_for
from orchestrator.planning.pricing import load_gpu_table


def quote(
    ctx: RunContext,
    manifest: Sequence[ManifestEntry],
    workers: int,
    probes: Sequence[ProbeRecord],
    simulator: FleetSimulator,
    at: float,
) -> ForecastRecord:
    """The run's forecast (steps 1-3): `probes` are those carved for it (none: a guess)."""
    if ctx.spec.models:
        return forecast_pools(ctx, manifest, probes, at, simulator)
    if any(p.busy_s is not None for p in probes):
        return forecast_from_probes(ctx, probes, manifest, workers, at, simulator)
    return guess(ctx, manifest, workers, at, measured_for(ctx, load_gpu_table()))

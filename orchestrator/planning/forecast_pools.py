"""`orch estimate` for a run of several models: each pool forecast alone, the run's band from theirs.

Each pool (a `models:` entry) is forecast as a run of its own would be: from its own probes where
`--probe` measured it (forecast.forecast_from_probes), else guessed (forecast.guess) from its
model's size; on its machines (its `resources`; a worker of `gpus_per_worker` GPUs costs that
many), its own rows and its workers (the plan's, else the split `orch plan` makes:
pool_estimate.pool_fleets).
The pools run side by side, so the run ends with its slowest: each quantile of the run's duration
is the largest of the pools' at that quantile, and its cost is theirs summed. Quantile by quantile
is how the pools move together here: their doubt is mostly shared (one speed table, one share of
max_tokens generated).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.context import RunContext
from orchestrator.core.records import ManifestEntry, read_plan
from orchestrator.core.records.forecast import Band, CandidateForecast, ForecastRecord, ProbeRecord
from orchestrator.planning.forecast import FleetSimulator, forecast_from_probes, guess
from orchestrator.planning.measured import measured_for
from orchestrator.planning.pool_estimate import pool_fleets
from orchestrator.planning.pricing import load_gpu_table

QUANTILES = ("p10", "p50", "p90")


def forecast_pools(
    ctx: RunContext,
    manifest: Sequence[ManifestEntry],
    probes: Sequence[ProbeRecord],
    at: float,
    simulator: FleetSimulator,
) -> ForecastRecord:
    """The run's forecast from each pool's (from its probes where one measured it, else a guess),
    with each pool's kept in `pools`."""
    pools: dict[str, ForecastRecord] = {}
    prices = load_gpu_table()
    for pool, fleet in pool_fleets(ctx.spec, read_plan(ctx.store, ctx.layout), manifest).items():
        own, rows = ctx.for_pool(pool), [e for e in manifest if e.model == pool]
        mine = [p for p in probes if p.model == pool]
        if any(p.busy_s is not None for p in mine):
            record = forecast_from_probes(own, mine, rows, fleet.workers, at, simulator)
        else:
            record = guess(own, rows, fleet.workers, at, measured_for(own, prices, {e.chunk for e in rows}))
        pools[pool] = record
    measured = [pool for pool, record in pools.items() if record.kind == "probe"]
    if measured:
        guessed = [pool for pool in pools if pool not in measured]
        note = f"measured per model by its probes ({', '.join(measured)})" + (
            f"; guessed from the table ({', '.join(guessed)}): no probe of theirs measured" if guessed else ""
        )
    else:
        note = (
            f"a guess per model ({', '.join(pools)}): each pool's size, machines and rows, and its speed where "
            "its finished chunks (or an earlier run's of its model) measured one; `orch estimate --probe` narrows it"
        )
    return _combined(pools, at, "probe" if measured else "guess", note)


def _combined(pools: dict[str, ForecastRecord], at: float, kind: str, note: str) -> ForecastRecord:
    """The run's record from its pools': they run side by side (see the module's doc)."""
    fleets = {pool: _fleet(record) for pool, record in pools.items()}
    slowest = max(fleets, key=lambda pool: fleets[pool].duration_s.p50)
    run = CandidateForecast(
        gpu=", ".join(f"{pool}: {c.gpu}" for pool, c in fleets.items()),
        spot=all(c.spot for c in fleets.values()),
        workers=sum(c.workers for c in fleets.values()),
        duration_s=_largest([c.duration_s for c in fleets.values()]),
        cost_usd=_summed([c.cost_usd for c in fleets.values()]),
        engine_s=_largest([c.engine_s for c in fleets.values()]),
        basis=f"each pool {'measured' if kind == 'probe' else 'guessed'} alone; the run ends with its slowest "
        f"({slowest} at p50)",
    )
    return ForecastRecord(
        at=at,
        kind=kind,
        workers=run.workers,
        output_tokens=_summed([r.output_tokens for r in pools.values()]),
        prompt_tokens=sum(r.prompt_tokens for r in pools.values()),
        candidates=[run],
        fleet=run.key,
        note=note,
        pools=pools,
    )


def _fleet(record: ForecastRecord) -> CandidateForecast:
    """The candidate a pool runs on (its record's fleet: forecast.guess names one of its own)."""
    fleet = record.fleet_candidate()
    assert fleet is not None, record.fleet
    return fleet


def _largest(bands: list[Band]) -> Band:
    return Band(**{q: max(getattr(b, q) for b in bands) for q in QUANTILES})


def _summed(bands: list[Band]) -> Band:
    return Band(**{q: round(sum(getattr(b, q) for b in bands), 2) for q in QUANTILES})

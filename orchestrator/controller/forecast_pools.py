"""`orch estimate` for a run of several models: each pool guessed alone, the run's band from theirs.

Each pool (a `models:` entry) is guessed as a run of its own would be (forecast.guess): its model's
size, its machines (its `resources`; a worker of `gpus_per_worker` GPUs costs that many), its own
rows and its workers (the plan's, else the split `orch plan` makes: pool_estimate.pool_fleets).
The pools run side by side, so the run ends with its slowest: each quantile of the run's duration
is the largest of the pools' at that quantile, and its cost is theirs summed. Quantile by quantile
is how the pools move together here: their doubt is mostly shared (one speed table, one share of
max_tokens generated).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.controller.forecast import guess
from orchestrator.controller.pool_estimate import pool_fleets
from orchestrator.core.context import RunContext
from orchestrator.core.pools import spec_for_pool
from orchestrator.core.records import ManifestEntry, read_plan
from orchestrator.core.records.forecast import Band, CandidateForecast, ForecastRecord

QUANTILES = ("p10", "p50", "p90")


def guess_pools(ctx: RunContext, manifest: Sequence[ManifestEntry], at: float) -> ForecastRecord:
    """The run's guess from each pool's, with each pool's kept in `pools`."""
    pools: dict[str, ForecastRecord] = {}
    for pool, fleet in pool_fleets(ctx.spec, read_plan(ctx.store, ctx.layout), manifest).items():
        own = RunContext(spec_for_pool(ctx.spec, pool), ctx.store, ctx.layout)
        record = guess(own, [e for e in manifest if e.model == pool], fleet.workers, at)
        pools[pool] = _priced_per_gpu(record, fleet.gpus_per_worker)
    fleets = {pool: _fleet(record) for pool, record in pools.items()}
    slowest = max(fleets, key=lambda pool: fleets[pool].duration_s.p50)
    run = CandidateForecast(
        gpu=", ".join(f"{pool}: {c.gpu}" for pool, c in fleets.items()),
        spot=all(c.spot for c in fleets.values()),
        workers=sum(c.workers for c in fleets.values()),
        duration_s=_largest([c.duration_s for c in fleets.values()]),
        cost_usd=_summed([c.cost_usd for c in fleets.values()]),
        engine_s=_largest([c.engine_s for c in fleets.values()]),
        basis=f"each pool guessed alone; the run ends with its slowest ({slowest} at p50)",
    )
    return ForecastRecord(
        at=at,
        kind="guess",
        workers=run.workers,
        output_tokens=_summed([r.output_tokens for r in pools.values()]),
        prompt_tokens=sum(r.prompt_tokens for r in pools.values()),
        candidates=[run],
        fleet=run.key,
        note=f"a guess per model ({', '.join(pools)}): each pool's size, machines and rows; "
        "`orch plan --estimate` has each pool's speed once chunks are done",
        pools=pools,
    )


def _fleet(record: ForecastRecord) -> CandidateForecast:
    """The candidate a pool runs on (its record's fleet: forecast.guess names one of its own)."""
    fleet = record.fleet_candidate()
    assert fleet is not None, record.fleet
    return fleet


def _priced_per_gpu(record: ForecastRecord, gpus_per_worker: int) -> ForecastRecord:
    """A pool's record with its workers' cost times the GPUs each has (the table prices one GPU)."""
    if gpus_per_worker <= 1:
        return record
    scaled = [
        c.model_copy(
            update={"cost_usd": Band(**{q: round(getattr(c.cost_usd, q) * gpus_per_worker, 2) for q in QUANTILES})}
        )
        for c in record.candidates
    ]
    return record.model_copy(update={"candidates": scaled})


def _largest(bands: list[Band]) -> Band:
    return Band(**{q: max(getattr(b, q) for b in bands) for q in QUANTILES})


def _summed(bands: list[Band]) -> Band:
    return Band(**{q: round(sum(getattr(b, q) for b in bands), 2) for q in QUANTILES})

"""A run of several models estimated pool by pool: each pool's work over its own workers' speed.

Models of different sizes answer at different speeds on different machines, so one speed for
the run would be wrong for every pool. Each pool (spec `models:` entry) is estimated alone
(planning/estimate.py) from its own chunks, its own finished chunks' measured speed (else the
table's for its `resources.gpus`), and its own workers (the plan's, else the spec's split). The
run ends when its slowest pool ends, and costs the sum of the pools, each at its machines' price
(x `gpus_per_worker`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.core.pools import pool_workers, run_models
from orchestrator.core.records import ChunkStats, ManifestEntry, PlanRecord
from orchestrator.core.spec import RunSpec
from orchestrator.planning.estimate import estimate
from orchestrator.planning.pricing import GpuTable


@dataclass(frozen=True)
class PoolFleet:
    """What a pool runs on: its GPU candidates, workers, and GPUs per worker (its price's multiple)."""

    gpus: Sequence[str]
    workers: int
    gpus_per_worker: int = 1


@dataclass
class PoolEstimate:
    pool: str
    workers: int
    rows_left: int
    tokens_left: float
    tokens_per_row: float
    gpu: str  # the pool's fleet candidate (estimate.Estimate.fleet)
    tokens_per_s: float  # of one of its workers
    measured: bool  # tokens_per_s is what the pool measured on that GPU
    basis: str  # which speed, in words (estimate.Throughput.basis)
    spot_hours: float
    spot_usd: float
    on_demand_hours: float
    on_demand_usd: float


@dataclass
class PoolsEstimate:
    pools: list[PoolEstimate]

    @property
    def slowest(self) -> PoolEstimate:
        """The pool that ends last on spot: the run's end, and the pool a deadline must speed up."""
        return max(self.pools, key=lambda p: p.spot_hours)

    def to_dict(self) -> dict[str, Any]:
        """The run's figures (hours of the slowest pool, the pools' costs summed) and each pool's."""
        return {
            "slowest_pool": self.slowest.pool,
            "spot_hours": max(p.spot_hours for p in self.pools),
            "spot_usd": round(sum(p.spot_usd for p in self.pools), 2),
            "on_demand_hours": max(p.on_demand_hours for p in self.pools),
            "on_demand_usd": round(sum(p.on_demand_usd for p in self.pools), 2),
            "pools": {p.pool: asdict(p) for p in self.pools},
        }


def pool_fleets(spec: RunSpec, plan: PlanRecord | None, manifest: Sequence[ManifestEntry]) -> dict[str, PoolFleet]:
    """Each pool's machines: its `resources` (else the run's) and its workers in the plan (before
    a plan: the split `orch plan` would make). Empty for a run of one model."""
    rows: dict[str, int] = {}
    for e in manifest:
        if e.model:
            rows[e.model] = rows.get(e.model, 0) + e.rows
    if not rows or not spec.models:
        return {}
    planned: dict[str, int] = {}
    for a in plan.workers if plan is not None else []:
        if a.model:
            planned[a.model] = planned.get(a.model, 0) + 1
    counts = planned or pool_workers(spec, rows, spec.workers.count)
    models = run_models(spec)
    fleets = {}
    for pool in rows:
        resources = (models[pool].resources if pool in models else None) or spec.resources
        fleets[pool] = PoolFleet(resources.gpus, max(counts.get(pool, 1), 1), resources.gpus_per_worker)
    return fleets


def estimate_pools(
    prices: GpuTable,
    fleets: Mapping[str, PoolFleet],
    entries: Sequence[ManifestEntry],
    stats: Mapping[str, tuple[float, ChunkStats]],
    done: set[str],
    **settings: float,
) -> PoolsEstimate | None:
    """Each pool estimated from its own chunks, stats and workers; None without pools."""
    pools = []
    for pool, fleet in fleets.items():
        mine = [e for e in entries if e.model == pool]
        chunks = {e.chunk for e in mine}
        own_stats = {c: s for c, s in stats.items() if c in chunks}
        machines = prices.per_machine(fleet.gpus_per_worker)
        est = estimate(machines, fleet.gpus, fleet.workers, mine, own_stats, done & chunks, **settings)
        f = est.fleet
        pools.append(
            PoolEstimate(
                pool=pool,
                workers=fleet.workers,
                rows_left=est.rows_left,
                tokens_left=est.tokens_left,
                tokens_per_row=round(est.throughput.tokens_per_row, 1),
                gpu=f.gpu,
                tokens_per_s=f.tokens_per_s,
                measured=f.measured,
                basis=f.basis,
                spot_hours=f.spot_hours,
                spot_usd=f.spot_usd,
                on_demand_hours=f.on_demand_hours,
                on_demand_usd=f.on_demand_usd,
            )
        )
    return PoolsEstimate(pools) if pools else None

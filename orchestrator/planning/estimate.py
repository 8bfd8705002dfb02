"""How long and how much, before launching and while running: per GPU candidate, spot and on-demand.

Work is counted in output tokens: rows left x output tokens per row (measured from finished
chunks' stats; before any finish, half of each row's max_tokens). Speed per worker comes from the
price table (an L4's tokens/s for a 7-8B model x relative_speed) until chunks finish on a known
GPU: then the measured tokens/s replace it, and GPUs not seen yet are scaled from the measured
ones by their relative speeds (the model is the run's, not the table's).

Spot time includes what preemptions cost: each takes a restart and, on average, half a checkpoint
interval of work, at `preemptions_per_hour` per worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.core.records import ChunkStats, ManifestEntry
from orchestrator.planning.pricing import GpuTable

#: Provision + setup + model load of a new machine (what a preemption or a new launch costs).
RESTART_OVERHEAD_S = 600.0
#: An assumption for spot capacity, per worker-hour (SkyPilot's docs and the NSDI'24 traces put
#: typical GPU spot preemption rates between 0.1 and 1 per hour).
PREEMPTIONS_PER_HOUR = 0.25


@dataclass
class Throughput:
    tokens_per_s: dict[str, float]  # GPU type (or a measured accelerator's name) -> output tokens/s of one worker
    measured: dict[str, int]  # accelerator -> chunks its figure comes from (empty: the table's)
    tokens_per_row: float
    tokens_per_row_measured: bool
    #: Accelerators the fleet measured that the price table does not know (a local run's `cpu`):
    #: their speed is their own, and they scale no GPU's.
    unpriced: tuple[str, ...] = ()

    def basis(self, gpu: str) -> str:
        """Which speed an estimate on `gpu` used, in words: `measured 89 tok/s on cpu`,
        `1,650 tok/s each, scaled from what L4 measured`, `table 1,100 tok/s each`."""
        speed = f"{self.tokens_per_s.get(gpu, 0.0):,.0f} tok/s"
        if gpu in self.measured:
            return f"measured {speed} on {gpu}"
        scaled_from = [g for g in self.measured if g not in self.unpriced]
        if scaled_from:
            return f"{speed} each, scaled from what {', '.join(scaled_from)} measured"
        return f"table {speed} each"

    def speed_of(self, accelerator: str | None, prices: GpuTable) -> float | None:
        """Output tokens/s of one worker on `accelerator`: what it measured, else its GPU's; None if unknown."""
        if accelerator in self.tokens_per_s:
            return self.tokens_per_s[accelerator]
        gpu = prices.find(accelerator)
        return self.tokens_per_s.get(gpu.name) if gpu is not None else None


@dataclass
class Candidate:
    gpu: str
    tokens_per_s: float
    measured: bool
    spot_hours: float
    spot_usd: float
    on_demand_hours: float
    on_demand_usd: float
    cheapest_per_hour: bool  # what SkyPilot's any_of picks when capacity allows
    #: Which speed it used, in words (Throughput.basis).
    basis: str = ""


@dataclass
class Estimate:
    workers: int
    rows_total: int
    rows_left: int
    tokens_left: float
    throughput: Throughput
    candidates: list[Candidate]
    price_table_date: str
    preemptions_per_hour: float
    restart_overhead_s: float
    #: The candidate the fleet runs on: what the run measured on a machine the price table does not
    #: know (a local run's cpu), else any_of's pick, the cheapest per hour.
    fleet_gpu: str = ""
    #: A run of several models: each pool estimated alone, the run's end its slowest pool's
    #: (planning/pool_estimate.py's PoolsEstimate.to_dict); None for one model.
    pools: dict[str, Any] | None = None

    @property
    def fleet(self) -> Candidate:
        return next(c for c in self.candidates if c.gpu == self.fleet_gpu)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(
    prices: GpuTable,
    gpus: Sequence[str],
    entries: Sequence[ManifestEntry],
    stats: Mapping[str, tuple[float, ChunkStats]],
) -> Throughput:
    tokens: dict[str, float] = {}
    seconds: dict[str, float] = {}
    chunks: dict[str, int] = {}
    rows_done = tokens_done = 0
    for _, s in stats.values():
        rows_done += s.rows
        tokens_done += s.tokens_out
        gpu = prices.find(s.accelerator)
        name = gpu.name if gpu is not None else s.accelerator
        if not name or s.seconds <= 0:
            continue
        tokens[name] = tokens.get(name, 0) + s.tokens_out
        seconds[name] = seconds.get(name, 0.0) + s.seconds
        chunks[name] = chunks.get(name, 0) + 1
    measured = {g: tokens[g] / seconds[g] for g in tokens if tokens[g] > 0}
    priced = [g for g in measured if prices.find(g) is not None]
    if priced:
        # Tokens/s per unit of relative speed, averaged over the GPUs measured (weighted by chunks).
        per_speed = sum(measured[g] / prices.get(g).relative_speed * chunks[g] for g in priced) / sum(
            chunks[g] for g in priced
        )
    else:
        per_speed = prices.reference_output_tokens_per_s
    speeds = {**measured, **{g: measured.get(g, per_speed * prices.get(g).relative_speed) for g in gpus}}
    if rows_done and tokens_done:
        per_row, per_row_measured = tokens_done / rows_done, True
    else:
        rows = sum(e.rows for e in entries)
        per_row, per_row_measured = (sum(e.max_output_tokens for e in entries) / 2 / rows if rows else 0.0), False
    unpriced = tuple(g for g in measured if g not in priced)
    return Throughput(speeds, {g: chunks[g] for g in measured}, per_row, per_row_measured, unpriced)


def estimate(
    prices: GpuTable,
    gpus: Sequence[str],
    workers: int,
    entries: Sequence[ManifestEntry],
    stats: Mapping[str, tuple[float, ChunkStats]],
    done: set[str],
    *,
    checkpoint_interval_s: float = 60.0,
    preemptions_per_hour: float = PREEMPTIONS_PER_HOUR,
    restart_overhead_s: float = RESTART_OVERHEAD_S,
) -> Estimate:
    tp = throughput(prices, gpus, entries, stats)
    rows_total = sum(e.rows for e in entries)
    rows_left = sum(e.rows for e in entries if e.chunk not in done)
    tokens_left = rows_left * tp.tokens_per_row
    largest = max((e.rows for e in entries if e.chunk not in done), default=0)
    # Each preemption costs a restart plus half an interval of redone work: the share of a spot
    # worker's hour that is lost.
    lost_share = min(preemptions_per_hour * (restart_overhead_s + checkpoint_interval_s / 2) / 3600, 0.9)
    cheapest = min(gpus, key=lambda g: prices.get(g).spot_usd_h)
    candidates = []
    for g in [*gpus, *tp.unpriced]:
        info = prices.find(g) if g not in tp.unpriced else None
        spot_usd_h, on_demand_usd_h = (info.spot_usd_h, info.on_demand_usd_h) if info else (0.0, 0.0)
        # Spread over the workers, but no faster than the largest chunk left on one worker.
        tokens = max(tokens_left / workers, largest * tp.tokens_per_row)
        work_h = tokens / tp.tokens_per_s[g] / 3600 if tp.tokens_per_s[g] > 0 else math.inf
        start_h = restart_overhead_s / 3600 if rows_left else 0.0
        od_h = work_h + start_h
        spot_h = work_h / (1 - lost_share) + start_h
        candidates.append(
            Candidate(
                gpu=g,
                tokens_per_s=round(tp.tokens_per_s[g], 1),
                measured=g in tp.measured,
                spot_hours=round(spot_h, 3),
                spot_usd=round(spot_h * workers * spot_usd_h, 2),
                on_demand_hours=round(od_h, 3),
                on_demand_usd=round(od_h * workers * on_demand_usd_h, 2),
                cheapest_per_hour=g == cheapest,
                basis=tp.basis(g),
            )
        )
    fleet = max(tp.unpriced, key=lambda g: tp.measured[g]) if tp.unpriced else cheapest
    return Estimate(
        workers,
        rows_total,
        rows_left,
        round(tokens_left),
        tp,
        candidates,
        prices.date,
        preemptions_per_hour,
        restart_overhead_s,
        fleet,
    )

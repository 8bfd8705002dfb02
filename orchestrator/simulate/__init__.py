"""`orch simulate`: how long, how much, and what preemptions cost, before paying; and orch against the
SkyPilot example's static sharding, at scales this machine cannot run.

Each seed draws a GPU per worker (uniform over the candidates) and a preemption trace, and every
policy compared replays exactly those.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.layout import chunk_id
from orchestrator.core.records import ManifestEntry
from orchestrator.planning.deadline import DeadlineSettings
from orchestrator.planning.forecast import SimulatedFleet
from orchestrator.planning.pricing import GpuTable, load_gpu_table
from orchestrator.simulate.config import SimConfig
from orchestrator.simulate.fleet import Fleet
from orchestrator.simulate.policies import ORCH, POLICIES, SKYPILOT_EXAMPLE, Policy
from orchestrator.simulate.results import FleetResult
from orchestrator.simulate.traces import Trace, bursty_trace, load_trace, poisson_trace

__all__ = [
    "ORCH",
    "POLICIES",
    "SKYPILOT_EXAMPLE",
    "SimConfig",
    "Summary",
    "estimate_seconds",
    "simulate",
    "summarise",
    "synthetic_manifest",
]


def synthetic_manifest(config: SimConfig, rng: random.Random) -> list[ManifestEntry]:
    """Chunks of rows_per_chunk rows (times a factor in [1/sqrt(spread), sqrt(spread)]). With
    `prefixes`, rows are spread evenly over them, and the chunks are as `--group-by-prefix`
    prepares them (rows in prefix order): each records its first and last prefix."""
    out = []
    sizes = []
    for _ in range(config.chunks):
        factor = config.rows_spread ** rng.uniform(-0.5, 0.5) if config.rows_spread > 1 else 1.0
        sizes.append(max(1, round(config.rows_per_chunk * factor)))
    total, before = sum(sizes), 0
    for i, rows in enumerate(sizes):
        prefixes: dict[str, Any] = {}
        if config.prefixes:
            first, last = before * config.prefixes // total, (before + rows - 1) * config.prefixes // total
            prefixes = {"prefix_groups": last - first + 1, "edge_prefixes": sorted({f"p{first}", f"p{last}"})}
        before += rows
        cid = chunk_id(i, config.chunks)
        out.append(
            ManifestEntry(
                chunk=cid,
                key=f"chunks/{cid}.jsonl",
                rows=rows,
                bytes=rows * 300,
                est_prompt_tokens=rows * 60,
                max_output_tokens=rows * 256,
                **prefixes,
            )
        )
    return out


def scenario(config: SimConfig, seed: int, prices: GpuTable) -> tuple[list[str], Trace]:
    """The seed's fleet (a GPU per worker) and its preemption trace: the same for every policy."""
    rng = random.Random(seed)
    gpus = [rng.choice(config.gpus) for _ in range(config.workers)]
    for g in set(gpus):
        prices.get(g)  # unknown GPU types fail here, with the table's names in the message
    rng = random.Random(seed * 7919 + 1)
    if config.trace:
        trace = load_trace(config.trace, gpus)
    elif config.outages:
        trace = bursty_trace(
            gpus,
            config.preemptions_per_hour,
            config.horizon_s,
            rng,
            outages=config.outages,
            outage_s=config.outage_s,
            within_s=config.outage_window_s,
        )
    else:
        trace = poisson_trace(gpus, config.preemptions_per_hour, config.horizon_s, rng)
    return gpus, trace


#: Seconds of this project's 2-CPU benchmark machine per simulated event (docs/BENCHMARKS.md, simulate
#: scale): a claimed and finished chunk; a renewal or checkpoint of the end game, the only ones
#: written as events (simulate/fleet.py); and the end of the run, where each exiting worker reads
#: every lease and heartbeat.
_COST_PER_CHUNK_S = 3e-4
_COST_PER_END_GAME_EVENT_S = 3e-4
_COST_PER_WORKER_PAIR_S = 6e-6


def estimate_seconds(config: SimConfig, runs: int, prices: GpuTable | None = None) -> float:
    """About how long `runs` simulations of `config` take, before running one.

    Long chunks make a long end game: each worker's last chunk renews its lease every lease_ttl / 3
    and checkpoints every interval, as events."""
    prices = prices or load_gpu_table(config.prices)
    speed = config.base_rows_per_s * statistics.fmean(prices.get(g).relative_speed for g in config.gpus)
    end_game_s = min(config.workers, config.chunks) * config.rows_per_chunk / speed
    per_run = (
        config.chunks * _COST_PER_CHUNK_S
        + end_game_s * (3 / config.lease_ttl_s + 1 / config.checkpoint_interval_s) * _COST_PER_END_GAME_EVENT_S
        + config.workers**2 * _COST_PER_WORKER_PAIR_S
    )
    return runs * per_run


def simulate(
    config: SimConfig,
    policy: Policy,
    seed: int,
    *,
    entries: Sequence[ManifestEntry] | None = None,
    prices: GpuTable | None = None,
    deadline: DeadlineSettings | None = None,
) -> FleetResult:
    """One run. With `deadline`, the deadline policy (planning/deadline.py) adds and retires
    on-demand workers every control interval, as `orch watch --deadline` does."""
    prices = prices or load_gpu_table(config.prices)
    entries = list(entries) if entries is not None else synthetic_manifest(config, random.Random(seed + 104729))
    gpus, trace = scenario(config, seed, prices)
    return Fleet(config, policy, entries, gpus, trace, prices, seed, deadline=deadline).run()


def fleet_outcome(
    fleet: SimulatedFleet, seed: int, entries: Sequence[ManifestEntry], prices: GpuTable
) -> tuple[float, float]:
    """The forecast's simulator (planning/forecast.FleetSimulator): one run of orch's policy over
    the rows left on a candidate fleet, its makespan (s) and cost ($)."""
    config = SimConfig(
        workers=fleet.workers,
        gpus=[fleet.gpu],
        spot=fleet.spot,
        base_rows_per_s=fleet.base_rows_per_s,
        restart_overhead_s=fleet.restart_overhead_s,
        checkpoint_interval_s=fleet.checkpoint_interval_s,
    )
    result = simulate(config, ORCH, seed, entries=list(entries), prices=prices)
    return result.makespan_s, result.cost_usd


@dataclass
class Summary:
    policy: str
    runs: int
    complete: int
    makespan_h: float
    makespan_h_min: float
    makespan_h_max: float
    lower_bound_h: float
    ratio: float
    ratio_max: float
    billed_gpu_h: float
    wasted_gpu_h: float
    lost_gpu_h: float
    idle_tail_gpu_h: float
    cost_usd: float
    preemptions: float
    rescues: float


def summarise(results: Sequence[FleetResult]) -> Summary:

    def mean(xs: Sequence[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    return Summary(
        policy=results[0].policy,
        runs=len(results),
        complete=sum(r.complete for r in results),
        makespan_h=mean([r.makespan_s / 3600 for r in results]),
        makespan_h_min=min(r.makespan_s for r in results) / 3600,
        makespan_h_max=max(r.makespan_s for r in results) / 3600,
        lower_bound_h=mean([r.lower_bound_s / 3600 for r in results]),
        ratio=mean([r.ratio for r in results]),
        ratio_max=max(r.ratio for r in results),
        billed_gpu_h=mean([r.billed_gpu_h for r in results]),
        wasted_gpu_h=mean([r.wasted_gpu_h for r in results]),
        lost_gpu_h=mean([r.lost_gpu_h for r in results]),
        idle_tail_gpu_h=mean([r.idle_tail_gpu_h for r in results]),
        cost_usd=mean([r.cost_usd for r in results]),
        preemptions=mean([r.preemptions for r in results]),
        rescues=mean([r.rescues for r in results]),
    )


#: How a fleet buys capacity, compared by `orch simulate --deadline-factor`.
MARKETS = ("on-demand only", "spot only", "greedy", "uniform progress", "deadline")


def deadline_study(
    config: SimConfig,
    seeds: int,
    factor: float,
    *,
    entries: Sequence[ManifestEntry] | None = None,
    prices: GpuTable | None = None,
) -> dict[str, list[FleetResult]]:
    """Per seed: the on-demand-only makespan M sets the deadline (factor x M); then spot only,
    greedy (spot until the slack is gone, then commit), Uniform Progress (on-demand whenever behind
    the line) and the deadline policy (which waits for spot while the slack allows) run against it,
    on the same GPUs and the same preemption trace."""
    prices = prices or load_gpu_table(config.prices)
    on_demand = config.model_copy(update={"spot": False, "preemptions_per_hour": 0.0, "outages": 0, "trace": None})
    out: dict[str, list[FleetResult]] = {m: [] for m in MARKETS}
    for seed in range(seeds):
        od = simulate(on_demand, ORCH, seed, entries=entries, prices=prices)
        deadline_s = factor * od.makespan_s
        od.deadline_s = deadline_s
        spot = simulate(config, ORCH, seed, entries=entries, prices=prices)
        spot.deadline_s = deadline_s
        runs = {"on-demand only": od, "spot only": spot}
        for name, greedy, wait in (
            ("greedy", True, False),
            ("uniform progress", False, False),
            ("deadline", False, True),
        ):
            settings = DeadlineSettings(
                deadline_s=deadline_s,
                restart_overhead_s=config.restart_overhead_s,
                max_on_demand=config.workers,
                greedy=greedy,
                spot_wait=wait,
                commit_margin_s=config.lease_ttl_s + config.control_interval_s,
            )
            runs[name] = simulate(config, ORCH, seed, entries=entries, prices=prices, deadline=settings)
        for name, result in runs.items():
            out[name].append(result)
    return out

"""What a simulation runs: the workload, the fleet, the preemption model, the protocol's timings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core.spec import DEFAULT_GPUS
from orchestrator.planning.estimate import RESTART_OVERHEAD_S


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workers: int = Field(16, ge=1)
    chunks: int = Field(200, ge=1, description="synthetic manifest: number of chunks")
    rows_per_chunk: int = Field(5000, ge=1)
    rows_spread: float = Field(1.0, ge=1.0, description="largest/smallest chunk (1: all equal)")
    gpus: list[str] = Field(default_factory=lambda: list(DEFAULT_GPUS), description="drawn uniformly per worker")
    spot: bool = Field(True, description="workers run on spot (preemptible) machines")
    base_rows_per_s: float = Field(
        1.0, gt=0, description="an L4's speed: a 5,000-row chunk in ~1.4 h, within SkyPilot's '1-2 hours on an L4'"
    )
    preemptions_per_hour: float = Field(0.25, ge=0, description="per spot worker: Poisson rate")
    trace: str | None = Field(None, description="a preemption trace file (replaces the Poisson model)")
    outages: int = Field(
        0,
        ge=0,
        description="synthetic bursts with no spot capacity at all (replaces nothing: added to the Poisson model)",
    )
    outage_s: float = Field(7200.0, gt=0, description="length of each burst")
    outage_window_s: float = Field(6 * 3600.0, gt=0, description="bursts start uniformly within this window")
    zones: dict[str, float] = Field(
        default_factory=dict,
        description="spot zones and each one's preemptions per hour (replaces the Poisson model and the trace): "
        "workers go where the zone ranking of real launches sends them",
    )
    zone_order: Literal["ranked", "listed"] = Field(
        "ranked", description="ranked: orch's zone steering; listed: always the first zone listed"
    )
    restart_overhead_s: float = Field(RESTART_OVERHEAD_S, ge=0, description="provision + setup + model load")
    checkpoint_interval_s: float = Field(60.0, gt=0)
    lease_ttl_s: float = Field(300.0, gt=0)
    prices: str | None = Field(None, description="GPU price table (default: orchestrator/data/gpus.yaml)")
    control_interval_s: float = Field(60.0, gt=0, description="how often the deadline policy decides")
    horizon_s: float = Field(30 * 86400.0, gt=0, description="stop a run that has not finished by then")
    prefixes: int = Field(0, ge=0, description="distinct shared prompt prefixes in the workload (0: none)")
    prefix_fraction: float = Field(
        0.5, ge=0, lt=1, description="share of a row's work that is its prefix's prefill: saved on a cache hit"
    )
    cache_prefixes: int = Field(8, ge=1, description="prefixes one worker's KV cache holds at once")

    @model_validator(mode="after")
    def _gpus(self) -> SimConfig:
        if not self.gpus:
            raise ValueError("name at least one GPU type")
        return self

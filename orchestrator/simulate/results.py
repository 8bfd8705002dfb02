"""What a simulation returns: the run's figures and each worker's time line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.planning.deadline import Decision


@dataclass
class Segment:
    worker: int
    kind: str  # "work" | "lost" | "restart" | "wait"
    start: float
    end: float
    chunk: str | None = None


@dataclass
class FleetResult:
    policy: str
    seed: int
    complete: bool
    makespan_s: float
    lower_bound_s: float
    billed_gpu_h: float
    lost_gpu_h: float
    restart_gpu_h: float
    idle_tail_gpu_h: float
    cost_usd: float
    chunks: int
    markers: int
    preemptions: int
    rescues: int
    workers: list[dict[str, Any]]
    segments: list[Segment] = field(repr=False, default_factory=list)
    deadline_s: float | None = None
    on_demand_launched: int = 0
    decisions: list[Decision] = field(repr=False, default_factory=list)

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_s is None else self.complete and self.makespan_s <= self.deadline_s

    @property
    def makespan_vs_deadline(self) -> float:
        if self.deadline_s is None:
            raise ValueError("this simulation had no deadline")
        return self.makespan_s / self.deadline_s

    @property
    def on_demand_gpu_h(self) -> float:
        """Hours billed for the on-demand workers the deadline policy added."""
        return float(sum(w["billed_h"] for w in self.workers if w["extra"]))

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.lower_bound_s if self.lower_bound_s else float("inf")

    @property
    def wasted_gpu_h(self) -> float:
        return self.lost_gpu_h + self.restart_gpu_h

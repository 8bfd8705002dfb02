"""A simulated worker: its machine, its pass over a chunk, and the virtual clock and parts it uses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.protocol.checkpoints import ChunkJob, RowStat
from orchestrator.core.protocol.claims import ChunkClaimer
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import LeaseKeeper


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class UnitCodec:
    """Parts of the simulator: row indices as ranges, so a resume reads them back like real parts."""

    ext = "sim"

    def encode(self, rows: Sequence[RowStat]) -> bytes:
        ranges: list[list[int]] = []
        for index in sorted(r.index for r in rows):
            if ranges and index == ranges[-1][1] + 1:
                ranges[-1][1] = index
            else:
                ranges.append([index, index])
        return json.dumps(ranges).encode()

    def decode(self, data: bytes) -> list[RowStat]:
        return [RowStat(i, False, 0, 0) for a, b in json.loads(data) for i in range(a, b + 1)]


@dataclass
class Session:
    """One worker's pass over one chunk."""

    job: ChunkJob[Any]
    keeper: LeaseKeeper
    start: float
    remaining: list[int]
    flushed: int = 0


@dataclass
class SimWorker:
    index: int
    gpu: str
    rate: float  # units per second
    spot: bool
    price: float  # USD per hour
    up: bool = False
    exited_at: float | None = None
    epoch: int = 0
    restarts: int = 0
    billed_since: float | None = None
    billed_s: float = 0.0
    claimer: ChunkClaimer | None = None
    heartbeat: HeartbeatPublisher | None = None
    session: Session | None = None
    chunks_done: int = 0
    #: Launched by the deadline policy on top of the planned fleet (on-demand).
    extra: bool = False
    retired: bool = False
    #: When its machine is provisioned (capacity found): from then on it is coming up.
    provisioning_since: float | None = 0.0

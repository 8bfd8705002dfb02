"""What one worker process did: the numbers of its JSON summary line and of its heartbeat."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.exits import WorkerStatus
from worker.wire import RowResult


@dataclass
class Totals:
    """What this process did: the numbers of the JSON summary line and the heartbeat."""

    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    #: Prompt tokens the engine's prefix cache held (part of tokens_in).
    tokens_cached: int = 0
    chunks_done: int = 0
    chunks_lost: int = 0
    #: Body fields ignored under `requests.unknown_fields: warn`: how many rows carried each.
    ignored_fields: dict[str, int] = field(default_factory=dict)
    busy_s: float = 0.0  # engine time in pumps that ended; `busy()` adds the one under way
    busy_since: float | None = None  # time.monotonic() when the pump under way began
    #: CPU seconds of this process in pumps that ended: on a shared machine the engine's wall time
    #: carries the neighbours' load, its CPU time does not (bench/forecast_bench.py compares both).
    busy_cpu_s: float = 0.0
    busy_cpu_since: float | None = None  # time.process_time() when the pump under way began
    #: Rows one engine batch holds (the engine's capacity, once loaded): when that many rows are
    #: done, `first_batch` keeps [busy_s, busy_cpu_s, rows, tokens_in, tokens_out, tokens_cached]
    #: so a probe can measure its rate past the engine's warm-up (planning/forecast.py).
    batch_rows: int = 0
    first_batch: list[float] | None = None
    load_s: float = 0.0  # loading the engine (imports and weights): part of wall_s, not of the work
    load_cpu_s: float = 0.0  # the same in CPU seconds: what a shared machine's benchmarks can compare
    started_at: float = field(default_factory=time.time)
    # The chunk in hand.
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0

    def add(self, rows: list[RowResult]) -> None:
        """Count finished rows (those of the chunk in hand also in its own count)."""
        self.requests += len(rows)
        self.errors += sum(r.error for r in rows)
        self.tokens_in += sum(r.tokens_in for r in rows)
        self.tokens_out += sum(r.tokens_out for r in rows)
        self.tokens_cached += sum(r.tokens_cached for r in rows)
        self.chunk_rows_done += sum(1 for r in rows if r.chunk == self.chunk)
        if self.first_batch is None and self.batch_rows and self.requests >= self.batch_rows:
            self.first_batch = [round(self.busy(), 3), round(self.busy_cpu(), 3), self.requests, self.tokens_in]
            self.first_batch += [self.tokens_out, self.tokens_cached]

    def ignored(self, names: tuple[str, ...]) -> None:
        """Count a request's ignored body fields (vLLM's server logs them; orch counts them)."""
        for name in names:
            self.ignored_fields[name] = self.ignored_fields.get(name, 0) + 1

    def busy(self) -> float:
        """Seconds the engine has been working so far, the pump under way included: rates read
        while a run goes (heartbeats, progress lines) must not wait for the engine to drain."""
        since = self.busy_since
        return self.busy_s + (time.monotonic() - since if since is not None else 0.0)

    def busy_cpu(self) -> float:
        """CPU seconds of this process in the engine's pumps so far, the one under way included."""
        since = self.busy_cpu_since
        return self.busy_cpu_s + (time.process_time() - since if since is not None else 0.0)

    def rows_per_s(self, *, min_busy_s: float = 0.0) -> float | None:
        """Rows answered per engine second; None until a row is answered and the engine has
        worked longer than `min_busy_s` (what a decision needs before it trusts the figure)."""
        busy = self.busy()
        return self.requests / busy if busy > min_busy_s and self.requests else None

    def measured_rows_per_s(self) -> float | None:
        """The pace a rescue decision may trust: one engine second at least behind it."""
        return self.rows_per_s(min_busy_s=1.0)

    def tokens_per_s(self) -> float:
        """Tokens generated per engine second (0 before the engine worked)."""
        busy = self.busy()
        return (self.tokens_out / busy) if busy > 0 else 0.0

    def summary(self, wall_s: float, status: WorkerStatus) -> dict[str, Any]:
        """The JSON summary line's numbers (the last line a worker prints)."""
        return {
            "status": status,
            "requests": self.requests,
            "errors": self.errors,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_cached": self.tokens_cached,
            "tokens_per_s": round(self.tokens_out / wall_s, 2) if wall_s > 0 else 0.0,
            "busy_s": round(self.busy(), 3),
            "busy_cpu_s": round(self.busy_cpu_s, 3),
            "chunks_done": self.chunks_done,
            "chunks_lost": self.chunks_lost,
            **({"ignored_fields": dict(sorted(self.ignored_fields.items()))} if self.ignored_fields else {}),
            "wall_s": round(wall_s, 3),
            "load_s": round(self.load_s, 3),
            "load_cpu_s": round(self.load_cpu_s, 3),
        }

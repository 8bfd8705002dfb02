"""A run's forecast, p10/p50/p90 per candidate: what `orch estimate` prints and `orchestrator.estimate` returns.

1. The probes: made and run now (`probe`), or those made before (none: a guess from the table).
2. The one quote from them (planning/quote.py: per model pool in a run of several, from the
   measured probes, else a guess from what finished chunks measured or the table).
3. Kept in the store (forecast.json): collect holds it against what happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.probe_limits import PROBE_BUDGET_USD, PROBE_SHARE
from orchestrator.core.records import read_manifest
from orchestrator.core.records.forecast import ForecastRecord, ProbeRecord, read_probes
from orchestrator.fleet.probe import probe_summary, run_probes
from orchestrator.planning.quote import quote
from orchestrator.simulate import fleet_outcome


@dataclass(frozen=True)
class Forecast:
    """A run's forecast (`record`: per candidate GPU, spot and on-demand, duration and cost bands)
    and the probes it was made from (none measured: a guess)."""

    record: ForecastRecord
    probes: list[ProbeRecord]

    @property
    def measured(self) -> list[ProbeRecord]:
        """The probes that measured something (their engine time is known)."""
        return [p for p in self.probes if p.busy_s is not None]

    def to_dict(self) -> dict[str, Any]:
        """The forecast as `orch estimate --json` prints it: the record, and what the probes measured."""
        doc: dict[str, Any] = self.record.model_dump()
        measured = self.measured
        if measured:
            doc["probe"] = probe_summary(measured[0])
            doc["probes"] = [probe_summary(p) for p in self.probes]
        return doc


def forecast_run(
    ctx: RunContext,
    *,
    probe: bool = False,
    probe_share: float = PROBE_SHARE,
    probe_rows: int | None = None,
    probe_budget: float = PROBE_BUDGET_USD,
    echo: Callable[[str], None] = lambda _line: None,
) -> Forecast:
    """Steps 1-3 for a prepared run; `echo` hears the probe's progress (minutes on SkyPilot). A
    KeyboardInterrupt while the probe runs leaves its worker going (the caller says so)."""
    made = (
        run_probes(ctx, probe_share, min_rows=probe_rows, budget_usd=probe_budget, echo=echo)
        if probe
        else read_probes(ctx.store, ctx.layout)
    )
    manifest = read_manifest(ctx.store, ctx.layout)
    record = quote(ctx, manifest, ctx.spec.workers.count, made, fleet_outcome, time.time())
    ctx.store.put(ctx.layout.forecast, record.to_bytes())
    return Forecast(record, made)

"""A complete run's actual engine time, duration, cost and output tokens beside its forecast's p50, kept
in the forecast record (`orch runs` and `orch status` show it); collect writes it once the run is whole."""

from __future__ import annotations

from orchestrator.collect.report import CollectReport
from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_marker
from orchestrator.core.records.base import read_record
from orchestrator.core.records.forecast import ForecastRecord, read_probes
from orchestrator.core.store import Store
from orchestrator.runview.forecast_check import fleet_engine_s
from orchestrator.runview.status import pace_so_far

#: The actual figures beside the forecast: engine_s, duration_s, cost_usd, output_tokens, their errors
#: against the p50 (engine_error, output_tokens_error) and inside_band (1.0 when inside p10-p90).
ForecastActual = dict[str, float]


def forecast_actual(ctx: RunContext, report: CollectReport) -> ForecastActual | None:
    """The run's actual figures from its finished chunks and collect's report, written into its
    forecast record; None when the run was never forecast (`orch estimate`)."""
    pace = pace_so_far(ctx.store, ctx.layout)
    usd = (report.cost_per_m_tokens or {}).get("all", {}).get("usd", 0.0)
    return record_actual(
        ctx.store,
        ctx.layout,
        output_tokens=report.tokens.generated_tokens,
        duration_s=pace.wall_s if pace else 0.0,
        cost_usd=usd,
    )


def record_actual(
    store: Store, layout: RunLayout, *, output_tokens: int, duration_s: float, cost_usd: float
) -> ForecastActual | None:
    """Write the run's actual figures into its forecast record (None: the run had no forecast)."""
    found = read_record(store, layout.forecast, ForecastRecord)
    if found is None:
        return None
    record = found[0]
    # The probes' workers answered before the fleet started: their engine time is not the fleet's.
    markers = [read_marker(store, layout, p.chunk) for p in read_probes(store, layout) if p.busy_s is not None]
    leave_out = {m.holder for m in markers if m is not None}
    fleet = record.fleet_candidate()
    assert fleet is not None, record.fleet  # forecast.py names one of its candidates
    engine = fleet_engine_s(store, layout, leave_out)
    actual = {
        "engine_s": round(engine, 2),
        "duration_s": round(duration_s, 1),
        "cost_usd": round(cost_usd, 4),
        "output_tokens": float(output_tokens),
    }
    actual["engine_error"] = round(fleet.engine_s.p50 / engine - 1, 3) if engine else 0.0
    actual["inside_band"] = float(fleet.engine_s.p10 <= engine <= fleet.engine_s.p90)
    actual["output_tokens_error"] = round(record.output_tokens.p50 / output_tokens - 1, 3) if output_tokens else 0.0
    store.put(layout.forecast, record.model_copy(update={"actual": actual}).to_bytes())
    return actual

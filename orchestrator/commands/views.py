"""What the commands print: the plan, a run's status, the estimate and the price table, as rich renderables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.backends.base import STATE_COLOURS, JobState
from orchestrator.commands.console import Group, Table, Text, table
from orchestrator.core.protocol.clocks import SKEW_WARN_S, describe_offset
from orchestrator.core.records import PlanRecord
from orchestrator.planning.pricing import GpuTable
from orchestrator.runview.sections import ArmView, ForecastCheck, ModelView, Rows, RunStatus, StageView, WorkerView
from orchestrator.runview.states import ACTIVITY_COLOURS, RUN_STATE_COLOURS, Recovery
from orchestrator.runview.tokens import tokens_line
from orchestrator.runview.words import doing, duration_band, recovery_line, state_words
from orchestrator.runview.words import duration as _duration


def render_plan(plan: PlanRecord) -> Group:
    """One row per worker (chunks, rows, estimated tokens, share), then the balance."""
    total = max(plan.est_tokens, 1)
    pools = any(a.model for a in plan.workers)  # a run of several models: each worker's model
    columns = ("worker", *(("model",) if pools else ()), "chunks", "rows", "est. tokens", "share")
    grid = table(*columns, right=("worker", "chunks", "rows", "est. tokens", "share"))
    for a in plan.workers:
        grid.add_row(
            str(a.worker),
            *((a.model or "",) if pools else ()),
            str(len(a.chunks)),
            f"{a.rows:,}",
            f"{a.est_tokens:,}",
            f"{100 * a.est_tokens / total:.1f}%",
        )
    loads = [a.est_tokens for a in plan.workers]
    mean = sum(loads) / len(loads)
    lines = [
        Text(
            f"{plan.chunks} chunks, {plan.rows:,} rows over {len(plan.workers)} workers; "
            f"largest load {max(loads) / mean if mean else 1:.3f}x the mean"
        )
    ]
    empty = sum(1 for a in plan.workers if not a.chunks)
    if empty:
        lines.append(
            Text(
                f"note: {empty} worker(s) have no chunk of their own (fewer chunks than workers); "
                "they will take over other workers' chunks"
            )
        )
    return Group(grid, *lines)


#: The columns of the workers table.
WORKER_COLUMNS = (
    "worker",
    "state",
    "doing",
    "accel",
    "where",
    "spot",
    "chunk",
    "progress",
    "own done",
    "finished",
    "tok/s",
    "beat",
)


def status_view(status: RunStatus) -> Group:
    """The run at a glance: the head lines, then one row per worker (orchestrator.console prints it)."""
    c, r = status.chunks, status.rows
    pct = 100 * c.done / c.total if c.total else 100.0
    eta = _duration(status.eta_s) if status.eta_s is not None else "unknown"
    title = Text.assemble((f"run {status.run}", "bold"), f"  ({backend_words(status)})")
    title.append(f"  {str(status.state).upper()}", style="bold " + RUN_STATE_COLOURS[status.state])
    head: list[Text] = [
        title,
        Text(
            f"chunks {c.done}/{c.total} ({pct:.0f}%)   {rows_line(r)}   errors {r.errors:,}"
            + (f"   set aside at prepare {r.set_aside:,}" if r.set_aside else "")
            + (f"   reused from earlier runs {r.reused:,}" if r.reused else "")
        ),
        Text(_pace_line(status, eta)),
    ]
    if status.tokens.prompt_tokens or status.tokens.generated_tokens:
        head.append(Text(tokens_line(status.tokens, status.cost_per_m_tokens)))
    if status.workers and not status.complete:
        head.append(Text(f"workers: {workers_line(status)}"))
    if status.estimate and not status.complete:
        e = status.estimate
        pools = [
            f"{name} {p.workers} x {p.gpu} {_duration(p.spot_hours * 3600)} / ${p.spot_usd:,.2f}"
            for name, p in (e.pools or {}).items()
        ]
        if pools:
            head.append(Text(f"estimate by pool (the run ends with {e.slowest_pool}): {', '.join(pools)} on spot"))
        head.append(
            Text(
                f"estimate left on {e.workers} x {e.gpu} ({e.basis}): {_duration(e.spot_hours * 3600)} / "
                f"${e.spot_usd:,.2f} on spot, {_duration(e.on_demand_hours * 3600)} / "
                f"${e.on_demand_usd:,.2f} on demand"
            )
        )
    if status.forecast:
        head.append(Text(forecast_line(status.forecast)))
    if status.deadline:
        d = status.deadline
        colour = {"critical": "red", "behind": "yellow", "waiting": "yellow"}.get(d.mode, "green")
        head.append(
            Text.assemble(
                (f"deadline {_duration(d.deadline_s)}", "bold"),
                (f" [{d.mode}]", colour),
                f" progress {d.progress:.1%} vs line {d.line:.1%}; last decision: {d.action}: {d.reason}"
                + (f" (budget ${d.budget_usd:,.2f})" if d.budget_usd else "")
                + (f"; {d.speed}" if d.speed else ""),
            )
        )
    if status.backend_note:
        head.append(Text(f"warning: {status.backend_note}", style="yellow"))
    if status.damaged:
        head.append(
            Text(f"DAMAGED: {len(status.damaged)} chunk(s) have a marker but cannot be collected:", style="red")
        )
        head.extend(Text(f"  {chunk}: {why}", style="red") for chunk, why in sorted(status.damaged.items()))
        chunks = " ".join(f"--chunk {chunk}" for chunk in sorted(status.damaged))
        head.append(Text(f"  run them again: orch redo --run {status.run} {chunks}, then orch resume --follow"))
    for key, why in sorted(status.corrupt_leases.items()):
        head.append(Text(f"warning: {key} is not a lease ({why})", style="yellow"))
    head.extend(_clock_warnings(status))
    sections: list[Text | Table] = [Text(""), models_table(status.models)] if status.models else []
    sections += [Text(""), arms_table(status.arms)] if status.arms else []
    sections += [Text(""), cascade_table(status.cascade)] if status.cascade else []
    workers = [_workers_table(status)] if status.workers else []
    return Group(*head, *sections, Text(""), *workers, *_recoveries(status), *_failures(status))


def backend_words(status: RunStatus) -> str:
    """The backend, or why there is none: nothing launched yet."""
    return status.backend or "not launched"


def models_table(models: Mapping[str, ModelView]) -> Table:
    """A run of several models: a row per model (chunks, rows, tokens, workers, $, $ per 1M tokens)."""
    numbers = ("chunks", "rows", "errors", "tokens", "workers", "$", "$/1M tok")
    grid = table("model", *numbers, right=numbers)
    for name, m in models.items():
        grid.add_row(
            name,
            f"{m.chunks.done}/{m.chunks.total}",
            f"{m.rows.done:,}/{m.rows.total:,}",
            f"{m.rows.errors:,}",
            f"{m.tokens.prompt_tokens + m.tokens.generated_tokens:,}",
            str(m.workers),
            f"{m.usd:,.2f}",
            "-" if m.usd_per_m_tokens is None else f"{m.usd_per_m_tokens:,.4f}",
        )
    return grid


def arms_table(arms: Mapping[str, ArmView]) -> Table:
    """A sweep: a row per arm (its model, rows done, errors, tokens, its share of its pool's $, $ per 1M tokens)."""
    numbers = ("rows", "errors", "tokens", "$", "$/1M tok")
    grid = table("arm", "model", *numbers, right=numbers)
    for name, a in arms.items():
        grid.add_row(
            name,
            a.model or "-",
            f"{a.rows.done:,}",
            f"{a.rows.errors:,}",
            f"{a.tokens.prompt_tokens + a.tokens.generated_tokens:,}",
            f"{a.usd:,.4f}",
            "-" if a.usd_per_m_tokens is None else f"{a.usd_per_m_tokens:,.4f}",
        )
    return grid


def comparison_table(comparison: Mapping[str, Any]) -> Table:
    """A sweep's arms compared (collect/comparison.py): a row per arm, its parse errors, tokens and $
    per row, the rows whose answers differ from the first arm's and the agreement field by field."""
    numbers = ("rows", "errors", "parse errors", "tok/row", "$/row", f"differ from {comparison['first']}")
    grid = table("arm", "model", *numbers, "agreement", right=numbers)
    for name, a in comparison["arms"].items():
        rate = a["parse_error_rate"]
        examples = ", ".join(a["differ_examples"][:3]) + (" ..." if a["rows_differ"] and a["rows_differ"] > 3 else "")
        grid.add_row(
            name,
            a["model"] or "-",
            f"{a['rows']:,}",
            f"{a['errors']:,}",
            "-" if rate is None else f"{a['parse_errors']:,} ({rate:.1%})",
            "-" if a["tokens_per_row"] is None else f"{a['tokens_per_row']:,.1f}",
            "-" if a["usd_per_row"] is None else f"{a['usd_per_row']:,.6f}",
            "-" if a["rows_differ"] is None else f"{a['rows_differ']:,}" + (f" ({examples})" if examples else ""),
            "(first)"
            if a["agreement"] is None
            else ", ".join("-" if v is None else f"{k} {v:.0%}" for k, v in a["agreement"].items()),
        )
    return grid


def cascade_table(stages: Sequence[StageView]) -> Table:
    """A cascade: a row per stage (its model and run, rows to answer, answered, passed on)."""
    numbers = ("rows", "answered", "escalated")
    grid = table("stage", "model", "run", *numbers, right=numbers)
    for s in stages:
        shown = ["-" if n is None else f"{n:,}" for n in (s.rows, s.answered, s.escalated)]
        grid.add_row(str(s.stage), s.model, s.run, *shown)
    return grid


def rows_line(rows: Rows) -> str:
    """`rows 12/200 done (2 of them checkpointed in unfinished chunks) (+6 answered, not yet saved)`:
    rows kept whatever happens, then those only in the workers' memory until their next checkpoint."""
    saved = rows.checkpointed
    return (
        f"rows {rows.done:,}/{rows.total:,} done"
        + (f" ({saved:,} of them checkpointed in unfinished chunks)" if saved else "")
        + f" (+{rows.in_progress:,} answered, not yet saved)"
    )


def _clock_warnings(status: RunStatus) -> list[Text]:
    """A line per worker whose clock is off the store's by SKEW_WARN_S or more."""
    return [
        Text(
            f"warning: worker {w.worker}'s clock is {describe_offset(w.clock_offset_s)} the store's "
            "(leases are judged by the store's clock; fix the machine's clock: NTP)",
            style="yellow",
        )
        for w in status.workers
        if w.clock_offset_s is not None and abs(w.clock_offset_s) >= SKEW_WARN_S
    ]


def _workers_table(status: RunStatus) -> Table:
    """One row per worker: its job's state, where it runs, its chunk and its pace."""
    workers = table(*WORKER_COLUMNS, right=("finished", "tok/s"))
    for w in status.workers:
        colour = STATE_COLOURS[w.state] if isinstance(w.state, JobState) else "white"
        workers.add_row(
            w.worker,
            Text(state_words(w), style=colour),
            Text(doing(w), style=ACTIVITY_COLOURS[w.activity]),
            w.accelerator or "-",
            "/".join(x for x in (w.cloud, w.region) if x) or "-",
            {True: "spot", False: "on-dem", None: "-"}[w.spot],
            w.chunk or "-",
            f"{w.chunk_rows_done}/{w.chunk_rows}" if w.chunk else "-",
            f"{w.chunks_done_of_own_list}/{w.chunks_assigned}",
            str(w.chunks_finished),
            f"{w.tokens_per_s:,.0f}" if w.chunk else "-",
            _duration(w.heartbeat_age_s) + " ago" if w.heartbeat_age_s is not None else "-",
        )
    return workers


def workers_line(status: RunStatus) -> str:
    """The workers by activity, each with its longest time where known: `1 loading (2m10s), 2 working`."""
    groups: dict[str, list[WorkerView]] = {}
    for w in status.workers:
        groups.setdefault(str(w.activity), []).append(w)
    parts = []
    for activity, views in groups.items():
        times = [w.activity_s for w in views if w.activity_s is not None]
        parts.append(f"{len(views)} {activity}" + (f" ({_duration(max(times), exact=True)})" if times else ""))
    return ", ".join(parts) or "none"


def _recoveries(status: RunStatus) -> list[Text]:
    lines = [(w.recovery, recovery_line(w)) for w in status.workers]
    return [Text(line, style="yellow" if r is Recovery.SPURIOUS else "red") for r, line in lines if line]


def _failures(status: RunStatus) -> list[Text]:
    """Why each failed worker's current job failed, and where its log is."""
    return [
        Text.assemble(
            (f"worker {w.worker} failed: ", "red"), str(w.failure_reason), f"\n  log: {w.log}" if w.log else ""
        )
        for w in status.workers
        if w.failure_reason
    ]


def _pace_line(status: RunStatus, eta: str) -> str:
    cost = f"cost so far ${status.cost.so_far_usd:,.2f} ({status.cost.worker_hours:.2f} worker-hours)"
    o = status.overall
    if status.complete and o:
        return (
            f"finished in {_duration(o.wall_s)}: {o.rows_per_s:,.2f} rows/s, {o.tokens_per_s:,.0f} tok/s"
            f" over the run   {cost}"
        )
    t = status.throughput
    ran = f"   run time {_duration(status.run_time_s)}" if status.run_time_s is not None else ""
    return f"throughput {t.rows_per_s:.2f} rows/s, {t.tokens_per_s:,.0f} tok/s   ETA {eta}{ran}   {cost}"


def forecast_line(f: ForecastCheck) -> str:
    """The forecast beside the pace: its duration band and the finish the pace projects, or how right it was."""
    d = f.duration_s
    line = f"forecast ({f.kind}) {duration_band(d.p10, d.p50, d.p90)}"
    if f.projected_s is not None:
        line += f"; at this pace {_duration(f.projected_s, exact=True)}: {f.projected_in_band}"
    if f.actual:
        a = f.actual
        line += f"; engine time {a['engine_error']:+.0%} ({'inside' if a['inside_band'] else 'outside'} p10-p90)"
    return line


def forecast_error(f: ForecastCheck | None) -> str:
    """`orch runs`' forecast column: the engine time's error once collected, `-` without a forecast."""
    if f is None:
        return "-"
    a = f.actual
    return f"{a['engine_error']:+.0%}{'' if a['inside_band'] else '!'}" if a else f"({f.kind})"


def render_runs(runs: Sequence[RunStatus | tuple[str, str]], *, now: float) -> Table:
    """One row per run: its state, model and input, chunks and rows done, cost so far, and how long
    ago it was prepared."""
    numbers = ("chunks", "rows", "errors", "cost", "forecast", "age")
    grid = table("run", "state", "backend", "model", "input", *numbers, right=numbers)
    for r in runs:
        if not isinstance(r, RunStatus):
            grid.add_row(r[0], Text("unreadable", style="red"), r[1], "", "", "", "", "", "", "", "")
            continue
        grid.add_row(
            r.run,
            Text(str(r.state), style=RUN_STATE_COLOURS[r.state]),
            r.backend or "-",
            r.model or "-",
            r.input or "-",
            f"{r.chunks.done}/{r.chunks.total}",
            f"{r.rows.done:,}/{r.rows.total:,}",
            f"{r.rows.errors:,}",
            f"${r.cost.so_far_usd:,.2f}",
            forecast_error(r.forecast),
            _duration(now - r.prepared_at) if r.prepared_at else "-",
        )
    return grid


def render_gpu_table(prices: GpuTable, before: GpuTable | None = None) -> Group:
    """One row per GPU and cloud; with `before`, the earlier prices beside the ones that changed."""
    grid = table("GPU", "cloud", "on-demand", "spot", "", right=("on-demand", "spot"))
    for name, gpu in prices.gpus.items():
        for cloud, p in sorted(gpu.prices.items()):
            old = before.gpus[name].prices.get(cloud) if before and name in before.gpus else None
            change = ""
            if before is not None and old != p:
                change = f"(was {old.on_demand:.3f} / {old.spot:.3f})" if old else "(new)"
            grid.add_row(name, cloud, f"{p.on_demand:.3f}", f"{p.spot:.3f}", change)
    return Group(Text(f"prices of {prices.date} ({prices.source}); USD per GPU-hour"), grid)

"""What prepare, prepare --check and collect print when they finish: shared by the commands that run
those steps (prepare, run, collect), beside commands.shared, .views and .console."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from orchestrator.collect.report import CollectReport
    from orchestrator.core.context import RunContext
    from orchestrator.prepare import CheckReport, PrepareReport


def print_prepare_report(ctx: RunContext, report: PrepareReport) -> None:
    """What prepare made, and every row it could not take as it was: set aside, not UTF-8, other models."""
    r = report.record
    if report.already_prepared:
        click.echo(f"run {report.run!r} is already prepared: {r.chunks} chunks, {r.rows:,} rows (nothing to do)")
    else:
        click.echo(
            f"prepared run {report.run!r}: {r.chunks} chunks, {r.rows:,} rows "
            f"in {report.seconds:.1f}s ({report.rows_per_s:,.0f} rows/s)"
        )
    if ctx.spec.reuse.runs:
        click.echo(
            f"reuse: {r.reused:,} row(s) answered by {', '.join(ctx.spec.reuse.runs)}, {r.rows:,} to run, "
            f"{r.reused + r.rows + r.errors:,} in all"
        )
    if r.errors:
        click.echo(
            click.style(f"{r.errors:,} bad row(s) set aside", fg="yellow")
            + f" -> {ctx.store.uri}/{r.errors_key} (collect answers them with error lines; --retry-out lists them)"
        )
        for problem in r.first_errors:
            click.echo(f"  {problem}")
        if r.errors > len(r.first_errors):
            click.echo(f"  ... and {r.errors - len(r.first_errors):,} more in the errors file")
    if r.not_utf8_rows:
        click.echo(
            click.style(f"{r.not_utf8_rows:,} row(s) have bytes that are not UTF-8", fg="yellow")
            + f" ({r.not_utf8_bytes:,} bytes, read as U+FFFD; --strict sets such rows aside): "
            + ", ".join(r.first_not_utf8)
            + (" ..." if r.not_utf8_rows > len(r.first_not_utf8) else "")
        )
    if r.models and ctx.spec.models:
        # Several models: each line went to the model it named; those naming none went to the first.
        click.echo("lines by the model they name: " + ", ".join(f"{m} {n:,}" for m, n in r.models.items()))
    elif r.models:
        serving = ctx.spec.model.name or "the model given at launch"
        named = ", ".join(f"{model!r} ({count:,})" for model, count in r.models.items())
        adapters = ctx.spec.model.lora
        others = sum(
            count for model, count in r.models.items() if model != ctx.spec.model.name and model not in adapters
        )
        if others and adapters:
            # A typo must not fall back to the base model: the worker answers these with error rows.
            click.echo(
                click.style(f"{others:,} line(s) name neither the model nor one of its adapters", fg="yellow")
                + f": {named}; they will be error rows (the run serves {serving} and {', '.join(sorted(adapters))})"
            )
        elif others:
            click.echo(
                click.style(f"{others:,} line(s) name another model", fg="yellow")
                + f": {named}; every line is answered by the run's model, {serving} (body.model says so)"
            )


def print_check_report(report: CheckReport) -> None:
    """`orch prepare --check` on an input the workers would take whole: what was checked, the rows set
    aside, and with `--reuse-from` how many requests earlier runs answered."""
    click.echo(
        f"checked {report.requests.checked:,} request(s) in {report.seconds:.1f}s: the workers would take every one "
        "(nothing written)"
    )
    if report.reused is not None and report.to_run is not None:
        click.echo(
            f"reuse: {report.reused:,} request(s) answered by earlier runs, {report.to_run:,} to run and pay for"
        )
    if report.set_aside:
        click.echo(click.style(f"{report.set_aside:,} bad row(s) would be set aside", fg="yellow") + ":")
        for problem in report.first_set_aside:
            click.echo(f"  {problem}")


def print_collect_report(report: CollectReport) -> None:
    r = report
    if r.leftovers_removed:
        size = sum(left.bytes for left in r.leftovers_removed)
        click.echo(
            f"removed {len(r.leftovers_removed)} temporary file(s) or folder(s) that killed collects left "
            f"({size:,} bytes): "
            + ", ".join(left.path for left in r.leftovers_removed[:3])
            + (" ..." if len(r.leftovers_removed) > 3 else ""),
            err=True,
        )
    chunks = f"{r.chunks_complete}/{r.chunks_total} chunks complete"
    if r.out_written:
        shape = " table" if r.shape == "table" else ""
        click.echo(f"wrote {r.rows_written:,} of {r.rows_total:,} rows to {r.out} ({r.format}{shape}); {chunks}")
    else:
        click.echo(f"collected {r.rows_written:,} of {r.rows_total:,} rows; {chunks}; {r.out} not written")
    if r.table_commit:
        click.echo(r.table_commit)
    if r.errors:
        set_aside = f" ({r.set_aside:,} set aside at prepare)" if r.set_aside else ""
        click.echo(
            click.style(f"{r.errors:,} error row(s)", fg="yellow")
            + f"{set_aside}, e.g. {', '.join(r.examples['errors'])}"
        )
    if r.missing or r.missing_chunks:
        shown = ", ".join(r.missing_chunks[:10]) + (" ..." if len(r.missing_chunks) > 10 else "")
        click.echo(
            click.style(f"{r.missing:,} row(s) missing", fg="red")
            + (f" (chunks without a marker: {shown})" if r.missing_chunks else "")
        )
    if r.duplicates or r.mismatched:
        click.echo(click.style(f"{r.duplicates} duplicate and {r.mismatched} mismatched line(s) left out", fg="red"))
    if r.tokens.total:
        from orchestrator.runview.sections import CostPerM
        from orchestrator.runview.tokens import tokens_line

        bought = CostPerM.model_validate(r.cost_per_m_tokens) if r.cost_per_m_tokens else None
        click.echo(tokens_line(r.tokens.section(), bought))
    if r.cascade:
        stages = (f"{m} answered {c['answered']:,}, escalated {c['escalated']:,}" for m, c in r.cascade.items())
        click.echo("cascade: " + "; ".join(stages))
    if r.reused:
        from orchestrator.runview.words import duration

        usd = f", ${r.usd_saved:,.4f}" if r.usd_saved is not None else ""
        took = f", {duration(r.engine_s_saved, exact=True)} of worker time" if r.engine_s_saved else ""
        click.echo(
            f"reused {r.reused:,} row(s) from earlier runs, ran {r.rows_run:,}, {r.rows_total:,} in all; "
            f"saved {r.tokens_saved.total:,} tokens{usd}{took}"
        )
    if r.retry_out:
        click.echo(
            f"{r.retry_rows:,} failed or missing request(s) written to {r.retry_out} "
            "(orch prepare it with --format openai-batch to retry)"
        )
    if r.comparison:
        from orchestrator.commands.console import console
        from orchestrator.commands.views import comparison_table

        console().print(comparison_table(r.comparison))


def print_forecast(doc: dict[str, Any]) -> None:
    """A forecast as `orch estimate` and `orch plan --estimate` print it: the probes, the tokens, the bands."""
    from rich.table import Table

    from orchestrator.commands.console import console
    from orchestrator.core.records.forecast import ForecastRecord
    from orchestrator.runview.words import duration as duration_text
    from orchestrator.runview.words import duration_band

    for p in doc.get("probes", []):
        of = f" of {p['model']}" if p["model"] else ""
        if p["stopped"] or p["engine_s"] is None:
            click.echo(f"probe{of} on {p['gpu']}: {p['rows']} rows, nothing measured: {p['stopped'] or 'not finished'}")
            continue
        click.echo(
            f"probe{of}: {p['rows']} rows ({p['share']:.1%}) on {p['accelerator']}: "
            f"{p['decode_tokens_per_s']} generated tok/s, "
            f"{p['prefill_tokens_per_s']} prompt tok/s, prefix cache {p['prefix_cache_hit']:.0%}, "
            f"{p['hit_max_tokens']} rows stopped at max_tokens; "
            f"engine {p['engine_s']:.1f} s, load {p['load_s'] or 0:.1f} s"
        )
    o = doc["output_tokens"]
    click.echo(
        f"output tokens p10 {o['p10']:,.0f} / p50 {o['p50']:,.0f} / p90 {o['p90']:,.0f}; "
        f"prompt tokens {doc['prompt_tokens']:,}"
    )
    table = Table(title=f"forecast ({doc['kind']}) for {doc['workers']} workers", title_justify="left")
    for col in ("candidate", "duration p10", "p50", "p90", "cost p10", "p50", "p90", "basis"):
        table.add_column(col, justify="left" if col in ("candidate", "basis") else "right")
    for c in doc["candidates"]:
        d, u = c["duration_s"], c["cost_usd"]
        table.add_row(
            f"{c['gpu']} {'spot' if c['spot'] else 'on-demand'}",
            *(duration_text(d[k], exact=True) for k in ("p10", "p50", "p90")),
            *(f"${u[k]:,.2f}" for k in ("p10", "p50", "p90")),
            c["basis"],
        )
    console().print(table)
    for pool, record in doc.get("pools", {}).items():
        c = ForecastRecord.model_validate(record).fleet_candidate()
        if c is None:
            continue
        d, u = c.duration_s, c.cost_usd
        click.echo(
            f"pool {pool}: {c.workers} worker(s) on {c.gpu}: {duration_band(d.p10, d.p50, d.p90)}, "
            f"${u.p50:,.2f} ({c.basis})"
        )
    click.echo(doc["note"])

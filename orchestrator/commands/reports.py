"""What prepare, prepare --check and collect print when they finish: shared by the commands that run
those steps (prepare, run, collect), beside commands.shared, .views and .console."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    """`orch prepare --check` on an input the workers would take whole: what was checked, and the rows set aside."""
    click.echo(
        f"checked {report.requests.checked:,} request(s) in {report.seconds:.1f}s: the workers would take every one "
        "(nothing written)"
    )
    if report.set_aside:
        click.echo(click.style(f"{report.set_aside:,} bad row(s) would be set aside", fg="yellow") + ":")
        for problem in report.first_set_aside:
            click.echo(f"  {problem}")


def print_collect_report(report: CollectReport) -> None:
    r = report
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
        usd = f", ${r.usd_saved:,.4f}" if r.usd_saved is not None else ""
        click.echo(
            f"reused {r.reused:,} row(s) from earlier runs, ran {r.rows_run:,}, {r.rows_total:,} in all; "
            f"saved {r.tokens_saved.total:,} tokens{usd}"
        )
    if r.retry_out:
        click.echo(
            f"{r.retry_rows:,} failed or missing request(s) written to {r.retry_out} "
            "(orch prepare it with --format openai-batch to retry)"
        )

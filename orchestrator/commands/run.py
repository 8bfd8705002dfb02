"""`orch run`: prepare, plan, launch, watch and collect, in one command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from orchestrator.commands.reports import print_collect_report, print_prepare_report
from orchestrator.commands.shared import (
    Invocation,
    common_options,
    follow_run,
    input_flags,
    input_options,
    keep_columns_option,
    max_error_rate_option,
    merge_on_option,
    say_spec_changes,
    workers_line,
)

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext
    from orchestrator.prepare import PrepareReport


@click.command("run")
@common_options
@click.argument("sources", nargs=-1, required=True)
@input_options
@click.option("--workers", type=int, default=None, help="number of workers (default: the spec's workers.count)")
@click.option("--backend", type=click.Choice(["local", "skypilot"]), default=None, help="default: the spec's, local")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="where the collected output goes")
@click.option("--retry-out", type=click.Path(dir_okay=False), default=None, help="failed requests, for a retry run")
@click.option("--interval", type=float, default=5.0, show_default=True, help="seconds between checks")
@click.option("--strict", is_flag=True, help="stop at the first bad input row")
@keep_columns_option
@merge_on_option
@click.option(
    "--no-check", is_flag=True, help="skip prepare's request check (the workers answer bad requests with error rows)"
)
@max_error_rate_option
def run_command(
    inv: Invocation,
    sources: tuple[str, ...],
    workers: int | None,
    backend: str | None,
    out: str,
    retry_out: str | None,
    interval: float,
    strict: bool,
    no_check: bool,
    max_error_rate: float,
    keep_columns: list[str] | None,
    merge_on: str | None,
    **input_args: Any,
) -> int:
    """Run SOURCES through the model end to end and write one complete output to --out.

    Every step is idempotent: running the same command again picks up where it stopped.
    """
    from orchestrator.api.lifecycle import Callbacks, collect_output, describe_actual, start
    from orchestrator.collect.collect import check_output, output_shape
    from orchestrator.collect.error_rate import check_error_rate
    from orchestrator.collect.sinks import table_sink
    from orchestrator.collect.table import table_spec
    from orchestrator.core.errors import IncompleteRun

    # The output is checked before any work: a bad --out found after hours of it loses an evening.
    container = "parquet" if table_sink(out) is not None else check_output(out)  # a table: typed columns
    if retry_out:
        check_output(retry_out, "jsonl")
    flags = {**inv.flags, **input_flags(**input_args)}
    if workers is not None:
        flags["workers.count"] = workers
    if backend is not None:
        flags["backend"] = backend
    # Checked now, recorded once the prepare succeeded: a failed first attempt locks nothing.
    ctx = Invocation(inv.spec_file, flags).context(check=True, model="required")

    def prepared(run: RunContext, report: PrepareReport) -> None:
        say_spec_changes(run)
        print_prepare_report(run, report)
        if keep_columns and output_shape(None, container) == "table":
            # A column the input lacks is refused now, before any worker is paid for.
            table_spec(run.store, run.layout, container, keep_columns)

    # 1. prepare, plan, launch the workers the remaining chunks need (each a no-op when done)
    hear = Callbacks(progress=lambda line: click.echo(line, err=True), prepared=prepared, say=click.echo)
    started = start(ctx, list(sources), strict=strict, check=not no_check, hear=hear)
    # 2. follow until every chunk has a marker, then a cascade's later stages
    if started.remaining:
        click.echo(workers_line(started.launched, started.running, started.launcher.name))
        follow_run(ctx, started.launcher, interval, later_stages=True, check=not no_check)
    elif ctx.spec.sweep.cascade:
        follow_run(ctx, started.launcher, interval, later_stages=True, check=not no_check)
    # 3. collect
    collected = collect_output(ctx, out, retry_out=retry_out, keep_columns=keep_columns, merge_on=merge_on)
    result = collected.report
    print_collect_report(result)
    if collected.forecast is not None:
        click.echo(describe_actual(collected.forecast), err=True)
    if not result.complete:
        raise IncompleteRun(
            f"run {ctx.layout.run!r}: {result.missing:,} row(s) missing; {out} was not written",
            hint="orch resume --follow finishes it (then orch collect)",
        )
    check_error_rate(result, max_error_rate)
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(run_command)

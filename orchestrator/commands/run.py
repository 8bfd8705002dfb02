"""`orch run`: prepare, plan, launch, watch and collect, in one command."""

from __future__ import annotations

import functools
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
    say_spec_changes,
    workers_line,
)

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext
    from orchestrator.fleet.start import StartedRun
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
    **input_args: Any,
) -> int:
    """Run SOURCES through the model end to end and write one complete output to --out.

    Every step is idempotent: running the same command again picks up where it stopped.
    """
    from orchestrator.collect.collect import check_output, collect, output_shape
    from orchestrator.collect.error_rate import check_error_rate
    from orchestrator.collect.table import table_spec
    from orchestrator.core.errors import IncompleteRun
    from orchestrator.fleet.start import start_run
    from orchestrator.planning.pricing import load_gpu_table
    from orchestrator.runview.cascade import check_stage_names

    # The output is checked before any work: a bad --out found after hours of it loses an evening.
    container = check_output(out)
    if retry_out:
        check_output(retry_out, "jsonl")
    flags = {**inv.flags, **input_flags(**input_args)}
    if workers is not None:
        flags["workers.count"] = workers
    if backend is not None:
        flags["backend"] = backend
    # Checked now, recorded once the prepare succeeded: a failed first attempt locks nothing.
    ctx = Invocation(inv.spec_file, flags).context(check=True, model="required")

    def prepared(report: PrepareReport) -> None:
        say_spec_changes(ctx)
        print_prepare_report(ctx, report)
        if keep_columns and output_shape(None, container) == "table":
            # A column the input lacks is refused now, before any worker is paid for.
            table_spec(ctx.store, ctx.layout, container, keep_columns)

    if ctx.spec.sweep.cascade:
        check_stage_names(ctx)  # a stage's run name too long is said now, not after stage 0 has run
    # 1-3. prepare, plan, launch the workers the remaining chunks need (each a no-op when done)
    started = start_run(
        ctx,
        list(sources),
        strict=strict,
        check=not no_check,
        progress=lambda s: click.echo(s, err=True),
        on_prepared=prepared,
        echo=click.echo,
    )
    _follow(ctx, started, interval)  # 4. watch until every chunk has a marker
    if ctx.spec.sweep.cascade:
        _run_later_stages(ctx, not no_check, interval)
    # 5. collect
    result = collect(
        ctx.store,
        ctx.layout,
        out,
        retry_out=retry_out,
        prices=load_gpu_table(),
        default_spot=ctx.spec.resources.spot,
        partial=False,
        keep_columns=keep_columns,
    )
    print_collect_report(result)
    if not result.complete:
        raise IncompleteRun(
            f"run {ctx.layout.run!r}: {result.missing:,} row(s) missing; {out} was not written",
            hint="orch resume --follow finishes it (then orch collect)",
        )
    check_error_rate(result, max_error_rate)
    return 0


def _follow(ctx: RunContext, started: StartedRun, interval: float) -> None:
    if started.remaining:
        click.echo(workers_line(started.launched, started.running, started.launcher.name))
        follow_run(ctx, started.launcher, interval)


def _run_later_stages(ctx: RunContext, check: bool, interval: float) -> None:
    """A cascade's stages after the first, each steps 1-4 on its own run (each a no-op when done)."""
    from orchestrator.fleet.cascade import run_stages
    from orchestrator.fleet.start import start_run

    def run_stage(stage: RunContext, sources: list[str]) -> None:
        report = functools.partial(print_prepare_report, stage)
        _follow(stage, start_run(stage, sources, check=check, on_prepared=report, echo=click.echo), interval)

    run_stages(ctx, run_stage, click.echo)


def register(cli: click.Group) -> None:
    cli.add_command(run_command)

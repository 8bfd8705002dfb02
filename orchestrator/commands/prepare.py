"""`orch prepare` and `orch plan`: a dataset into chunks, chunks into per-worker lists."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from orchestrator.commands.reports import print_check_report, print_forecast, print_prepare_report
from orchestrator.commands.shared import (
    Invocation,
    common_options,
    input_flags,
    input_options,
    say_spec_changes,
)


@click.command("prepare")
@common_options
@click.argument("sources", nargs=-1, required=True)
@input_options
@click.option("--strict", is_flag=True, help="stop at the first bad row instead of setting it aside")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="only check every request as the workers will (fields, types, ranges, JSON schemas, model); write nothing",
)
@click.option(
    "--no-check", is_flag=True, help="skip the request check (the workers still answer such rows with error rows)"
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def prepare_command(
    inv: Invocation,
    sources: tuple[str, ...],
    strict: bool,
    check_only: bool,
    no_check: bool,
    as_json: bool,
    **input_args: Any,
) -> int:
    """Stream SOURCES (files, directories, s3://...) into chunks of OpenAI Batch requests.

    Every request is first held to the workers' own rules: one they would refuse stops prepare
    (exit 10), every problem listed by field with counts and file:line, before any chunk is written."""
    from orchestrator.core.errors import InputError
    from orchestrator.prepare import check_run, prepare_run

    if check_only and no_check:
        raise click.UsageError("--check and --no-check: choose one")
    # The spec is checked now, and recorded only once the prepare succeeded.
    ctx = Invocation(inv.spec_file, {**inv.flags, **input_flags(**input_args)}).context(check=True, model="checked")
    if check_only:
        checked = check_run(ctx, list(sources), progress=lambda s: click.echo(s, err=True))
        if as_json:
            click.echo(json.dumps(checked.to_dict()))
        if not checked.requests.ok:
            raise checked.requests.error()
        if not as_json:
            print_check_report(checked)
        if checked.set_aside:
            # A check that passes what prepare would set aside says so in its exit code too.
            first = checked.first_set_aside[0]
            raise InputError(
                f"{checked.set_aside:,} of {checked.rows:,} row(s) would be set aside, e.g. {first}",
                hint="fix those rows, or how they are read (--format, --template, --id-column, --text-column); "
                "prepared anyway, they are answered with error lines",
            )
        return 0
    report = prepare_run(
        ctx, list(sources), strict=strict, check=not no_check, progress=lambda s: click.echo(s, err=True)
    )
    say_spec_changes(ctx)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
        return 0
    print_prepare_report(ctx, report)
    return 0


@click.command("plan")
@common_options
@click.option("--workers", type=int, default=None, help="number of workers (default: the spec's workers.count)")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option(
    "--estimate",
    "with_estimate",
    is_flag=True,
    help="also the expected time and cost per GPU candidate, spot and on-demand",
)
def plan_command(inv: Invocation, workers: int | None, as_json: bool, with_estimate: bool) -> int:
    """Spread the run's chunks over workers, balanced by estimated work; write workers/<i>.txt."""
    from orchestrator.commands.console import console
    from orchestrator.commands.views import render_plan
    from orchestrator.core.records import read_manifest
    from orchestrator.core.records.forecast import read_probes
    from orchestrator.planning.plan import make_plan, write_plan
    from orchestrator.planning.quote import quote
    from orchestrator.simulate import fleet_outcome

    flags = dict(inv.flags)
    if workers is not None:
        if workers < 1:
            raise click.BadParameter("at least 1", param_hint="--workers")
        flags["workers.count"] = workers
    ctx = Invocation(inv.spec_file, flags).context(freeze=True)
    manifest = read_manifest(ctx.store, ctx.layout)
    plan = make_plan(ctx, manifest, ctx.spec.workers.count)
    write_plan(ctx.store, ctx.layout, plan)
    # The one quote `orch estimate` gives (planning/quote.py): the same run, the same figures.
    probes = read_probes(ctx.store, ctx.layout) if with_estimate else []
    est = quote(ctx, manifest, ctx.spec.workers.count, probes, fleet_outcome, time.time()) if with_estimate else None
    if as_json:
        doc = {
            "workers": [a.model_dump() for a in plan.workers],
            "chunks": plan.chunks,
            "rows": plan.rows,
            "est_tokens": plan.est_tokens,
        }
        if est is not None:
            doc["estimate"] = est.model_dump()
        click.echo(json.dumps(doc))
    else:
        console().print(render_plan(plan))
        if est is not None:
            click.echo("")
            print_forecast(est.model_dump())
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(prepare_command)
    cli.add_command(plan_command)

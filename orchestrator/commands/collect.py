"""`orch collect`: merge a run's outputs into one file, in input order, every custom_id checked."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from orchestrator.commands.reports import print_collect_report
from orchestrator.commands.shared import (
    Invocation,
    common_options,
    keep_columns_option,
    max_error_rate_option,
)

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext
    from orchestrator.runview.sections import ArmView


@click.command("collect")
@common_options
@click.option(
    "--out",
    "out",
    required=True,
    help="output file (.jsonl or .parquet), or a table to append to: iceberg://CATALOG/NS.TABLE, delta:PATH, "
    "lance:PATH (docs/tables.md)",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "openai", "jsonl", "parquet"]),
    default=None,
    help="table: a row per input row, typed columns; openai: OpenAI Batch output lines (the wire format); "
    "jsonl/parquet: the file format, for a name without the ending. Default: .parquet a table, .jsonl openai",
)
@keep_columns_option
@click.option(
    "--retry-out",
    type=click.Path(dir_okay=False),
    default=None,
    help="write the failed and missing requests here, as a new openai-batch input",
)
@click.option("--allow-partial", is_flag=True, help="exit 0 even when rows are missing")
@max_error_rate_option
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def collect_command(
    inv: Invocation,
    out: str,
    fmt: str | None,
    retry_out: str | None,
    allow_partial: bool,
    max_error_rate: float,
    as_json: bool,
    keep_columns: list[str] | None,
) -> int:
    """Merge outputs into one file in input order; check every custom_id appears exactly once."""
    from orchestrator.collect.collect import collect
    from orchestrator.collect.error_rate import check_error_rate
    from orchestrator.core.errors import IncompleteRun
    from orchestrator.planning.pricing import load_gpu_table

    ctx = inv.context()
    report = collect(
        ctx.store,
        ctx.layout,
        out,
        fmt=fmt,
        retry_out=retry_out,
        prices=load_gpu_table(),
        default_spot=ctx.spec.resources.spot,
        partial=allow_partial,
        keep_columns=keep_columns,
    )
    if report.complete:
        _forecast_check(ctx, report)
    arms = _arms(ctx)
    if as_json:
        shown = {name: arm.model_dump(mode="json") for name, arm in arms.items()}
        click.echo(json.dumps({**report.to_dict(), **({"arms": shown} if arms else {})}))
    else:
        print_collect_report(report)
        if arms:
            from orchestrator.commands.console import console
            from orchestrator.commands.views import arms_table

            console().print(arms_table(arms))
    if not report.complete and not allow_partial:
        raise IncompleteRun(
            f"run {ctx.layout.run!r} is incomplete: {report.missing:,} row(s) missing; {out} was not written",
            hint="orch resume --follow finishes it; --allow-partial writes what is there",
        )
    check_error_rate(report, max_error_rate)
    return 0


def _arms(ctx: RunContext) -> dict[str, ArmView]:
    """A sweep: each arm's rows, tokens and cost, as `orch status` counts them (runview/arms.py)."""
    from orchestrator.planning.pricing import load_gpu_table
    from orchestrator.runview.status import sweep_arms

    return sweep_arms(ctx.store, ctx.layout, ctx.spec, prices=load_gpu_table(), default_spot=ctx.spec.resources.spot)


def _forecast_check(ctx: Any, report: Any) -> None:
    """Predicted against actual, when the run was forecast (`orch estimate`): said, and kept in its record."""
    from orchestrator.runview.forecast_check import record_actual
    from orchestrator.runview.status import pace_so_far

    pace = pace_so_far(ctx.store, ctx.layout)
    usd = (report.cost_per_m_tokens or {}).get("all", {}).get("usd", 0.0)
    actual = record_actual(
        ctx.store,
        ctx.layout,
        output_tokens=report.tokens.generated_tokens,
        duration_s=pace.wall_s if pace else 0.0,
        cost_usd=usd,
    )
    if actual is not None:
        click.echo(
            f"forecast vs actual: engine {actual['engine_error']:+.0%} "
            f"({'inside' if actual['inside_band'] else 'outside'} p10-p90, actual {actual['engine_s']:.1f} s), "
            f"output tokens {actual['output_tokens_error']:+.0%}, duration {actual['duration_s']:.0f} s, "
            f"cost ${actual['cost_usd']:,.2f}",
            err=True,
        )


def register(cli: click.Group) -> None:
    cli.add_command(collect_command)

"""`orch collect`: merge a run's outputs into one file, in input order, every custom_id checked."""

from __future__ import annotations

import json

import click

from orchestrator.commands.reports import print_collect_report
from orchestrator.commands.shared import (
    Invocation,
    common_options,
    keep_columns_option,
    max_error_rate_option,
    merge_on_option,
)


@click.command("collect")
@common_options
@click.option(
    "--out",
    "out",
    required=True,
    help="output file (.jsonl or .parquet), or a table to append to (or merge into, --merge-on): "
    "iceberg://CATALOG/NS.TABLE, delta:PATH, lance:PATH (docs/tables.md)",
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
@merge_on_option
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
    merge_on: str | None,
) -> int:
    """Merge outputs into one file in input order; check every custom_id appears exactly once."""
    from orchestrator.api.lifecycle import collect_output, describe_actual
    from orchestrator.collect.error_rate import check_error_rate
    from orchestrator.core.errors import IncompleteRun

    ctx = inv.context()
    collected = collect_output(
        ctx, out, fmt=fmt, retry_out=retry_out, partial=allow_partial, keep_columns=keep_columns, merge_on=merge_on
    )
    report = collected.report
    if collected.forecast is not None:
        click.echo(describe_actual(collected.forecast), err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        print_collect_report(report)
    if not report.complete and not allow_partial:
        raise IncompleteRun(
            f"run {ctx.layout.run!r} is incomplete: {report.missing:,} row(s) missing; {out} was not written",
            hint="orch resume --follow finishes it; --allow-partial writes what is there",
        )
    check_error_rate(report, max_error_rate)
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(collect_command)

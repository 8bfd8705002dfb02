"""`orch prepare` and `orch plan`: a dataset into chunks, chunks into per-worker lists."""

from __future__ import annotations

import json

import click

from orchestrator.cli import Invocation, common_options


def input_options(func):
    for option in reversed(
        [
            click.option(
                "--format",
                "fmt",
                type=click.Choice(["openai-batch", "completion", "chat", "text"]),
                default=None,
                help="how rows become requests (default: the spec's, chat)",
            ),
            click.option("--num-chunks", type=int, default=None, help="split into this many chunks"),
            click.option("--rows-per-chunk", type=int, default=None, help="...or into chunks of this many rows"),
            click.option("--id-column", default=None, help="column with a stable id, used as custom_id"),
            click.option(
                "--turns",
                type=click.Choice(["first", "all"]),
                default=None,
                help="chat: the first user turn, or everything up to the last user turn",
            ),
            click.option("--conversation-column", default=None, help="chat: the column of role/content turns"),
            click.option("--text-column", default=None, help="text: the column to fill the template with"),
            click.option("--template", default=None, help="text: a str.format template, e.g. 'Summarise: {text}'"),
            click.option("--system-prompt", default=None, help="chat/text: a system message put first"),
        ]
    ):
        func = option(func)
    return func


def input_flags(
    fmt, num_chunks, rows_per_chunk, id_column, turns, conversation_column, text_column, template, system_prompt
) -> dict:
    flags = {
        "input.format": fmt,
        "input.id_column": id_column,
        "input.turns": turns,
        "input.conversation_column": conversation_column,
        "input.text_column": text_column,
        "input.template": template,
        "input.system_prompt": system_prompt,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    if num_chunks is not None and rows_per_chunk is not None:
        raise click.UsageError("--num-chunks and --rows-per-chunk: choose one")
    if num_chunks is not None:
        flags.update({"chunking.num_chunks": num_chunks, "chunking.rows_per_chunk": None})
    if rows_per_chunk is not None:
        flags.update({"chunking.rows_per_chunk": rows_per_chunk, "chunking.num_chunks": None})
    return flags


@click.command("prepare")
@common_options
@click.argument("sources", nargs=-1, required=True)
@input_options
@click.option("--strict", is_flag=True, help="stop at the first bad row instead of setting it aside")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def prepare_command(inv: Invocation, sources, strict, as_json, **input_args):
    """Stream SOURCES (files, directories, s3://...) into chunks of OpenAI Batch requests."""
    from orchestrator.prepare import prepare_run

    ctx = Invocation(inv.spec_file, {**inv.flags, **input_flags(**input_args)}).context(freeze=True)
    report = prepare_run(ctx, list(sources), strict=strict, progress=lambda s: click.echo(s, err=True))
    if as_json:
        click.echo(json.dumps(report.to_dict()))
        return 0
    if report.already_prepared:
        click.echo(
            f"run {report.run!r} is already prepared: {report.chunks} chunks, {report.rows:,} rows (nothing to do)"
        )
    else:
        click.echo(
            f"prepared run {report.run!r}: {report.chunks} chunks, {report.rows:,} rows "
            f"in {report.seconds:.1f}s ({report.rows_per_s:,.0f} rows/s)"
        )
    if report.errors:
        click.echo(
            click.style(f"{report.errors:,} bad row(s) set aside", fg="yellow")
            + f" -> {ctx.store.uri}/{report.errors_key}"
        )
        for problem in report.first_errors:
            click.echo(f"  {problem}")
        if report.errors > len(report.first_errors):
            click.echo(f"  ... and {report.errors - len(report.first_errors):,} more in the errors file")
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
def plan_command(inv: Invocation, workers, as_json, with_estimate):
    """Spread the run's chunks over workers, balanced by estimated work; write workers/<i>.txt."""
    from orchestrator.plan import plan_chunks, read_manifest, render_plan, write_plan

    flags = dict(inv.flags)
    if workers is not None:
        if workers < 1:
            raise click.BadParameter("at least 1", param_hint="--workers")
        flags["workers.count"] = workers
    ctx = Invocation(inv.spec_file, flags).context(freeze=True)
    manifest = read_manifest(ctx.store, ctx.layout)
    plan = plan_chunks(manifest, ctx.spec.workers.count)
    write_plan(ctx.store, ctx.layout, plan)
    est = run_estimate(ctx, manifest) if with_estimate else None
    if as_json:
        doc = {
            "workers": [a.model_dump() for a in plan.workers],
            "chunks": plan.chunks,
            "rows": plan.rows,
            "est_tokens": plan.est_tokens,
        }
        if est is not None:
            doc["estimate"] = est.to_dict()
        click.echo(json.dumps(doc))
    else:
        click.echo(render_plan(plan))
        if est is not None:
            from orchestrator.estimate import render_estimate

            click.echo("\n" + render_estimate(est))
    return 0


def run_estimate(ctx, manifest):
    """The estimate for this run as it stands: finished chunks' stats replace the table's speeds."""
    from orchestrator.estimate import estimate
    from orchestrator.pricing import load_gpu_table
    from orchestrator.protocol.checkpoints import read_chunk_stats
    from orchestrator.protocol.snapshot import list_done

    return estimate(
        load_gpu_table(),
        ctx.spec.resources.gpus,
        ctx.spec.workers.count,
        manifest,
        read_chunk_stats(ctx.store, ctx.layout),
        set(list_done(ctx.store, ctx.layout)),
        checkpoint_interval_s=ctx.spec.workers.checkpoint_interval,
    )


def register(cli: click.Group) -> None:
    cli.add_command(prepare_command)
    cli.add_command(plan_command)

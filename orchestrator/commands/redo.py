"""`orch redo`: run damaged chunks again: their markers, stats and parts go, and the fleet redoes them."""

from __future__ import annotations

import time
import uuid

import click

from orchestrator.commands.shared import Invocation, common_options


@click.command("redo")
@common_options
@click.option(
    "--chunk",
    "chunks",
    multiple=True,
    required=True,
    help="a chunk id (part_00042) or its number (42); repeat for several",
)
@click.option("--yes", "-y", is_flag=True, help="do not ask before deleting the chunks' outputs")
def redo_command(inv: Invocation, chunks: tuple[str, ...], yes: bool) -> int:
    """Drop a chunk's done marker, stats and output parts, so that the fleet runs it again.

    Safe while workers run: the chunk's lease is taken first, so no worker resumes it from parts
    being removed; once given back, any worker takes it. Use it on the chunks `orch status` or
    `orch collect` report as damaged. It asks first (--yes does not); with no terminal to ask on,
    it needs --yes.
    """
    from orchestrator.core.errors import InputError
    from orchestrator.core.layout import chunk_id
    from orchestrator.core.protocol.checkpoints import redo_chunk
    from orchestrator.core.protocol.heartbeats import is_beating, read_heartbeats
    from orchestrator.core.records import read_manifest

    ctx = inv.context()
    known = [e.chunk for e in read_manifest(ctx.store, ctx.layout)]
    wanted = []
    for given in chunks:
        chunk = chunk_id(int(given), len(known)) if given.isdigit() else given
        if chunk not in known:
            raise InputError(
                f"run {ctx.layout.run!r} has no chunk {given!r}",
                hint=f"chunk ids run from {known[0]} to {known[-1]}" if known else "the run has no chunks",
                where="--chunk",
            )
        wanted.append(chunk)
    confirm_deletion(ctx.layout.run, wanted, yes)
    holder = f"redo.{uuid.uuid4().hex[:10]}"
    for chunk in wanted:
        report = redo_chunk(
            ctx.store, ctx.layout, chunk, ttl=ctx.spec.workers.lease_ttl, now=time.time(), holder=holder
        )
        click.echo(
            f"{chunk}: {'marker' if report.had_marker else 'no marker'}, {report.parts_removed} part(s) and "
            f"{report.stats_removed} stats entr{'y' if report.stats_removed == 1 else 'ies'} removed; it runs again"
        )
    now, interval = time.time(), ctx.spec.workers.heartbeat_interval
    live = [
        w
        for w, beat in read_heartbeats(ctx.store, ctx.layout).items()
        if is_beating(beat, now=now, heartbeat_interval=interval)
    ]
    if live:
        click.echo(f"{len(live)} worker(s) running: they take it when their own work runs out")
    else:
        click.echo("no worker is running: `orch resume --follow` runs it")
    return 0


def confirm_deletion(run: str, chunks: list[str], yes: bool) -> None:
    """Ask before outputs are deleted; without a terminal, refuse unless --yes said so."""
    import sys

    from orchestrator.core.errors import OrchError

    if yes:
        return
    what = f"the done marker, stats and output parts of {len(chunks)} chunk(s) of run {run!r} ({', '.join(chunks)})"
    if not sys.stdin.isatty():
        raise OrchError(
            f"not deleting {what}: no terminal to ask on", hint="add --yes to delete them without asking", where="redo"
        )
    if not click.confirm(f"delete {what}, to run them again?", default=False):
        raise click.exceptions.Exit(1)


def register(cli: click.Group) -> None:
    cli.add_command(redo_command)

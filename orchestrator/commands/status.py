"""`orch status`: one view of a run; `--watch` redraws it in place, `--json` is for scripts."""

from __future__ import annotations

import json
import sys
import time

import click

from orchestrator.cli import Invocation, common_options


def current_status(ctx, prices_path: str | None = None, launcher=None):
    """The run's status, asking the backend that launched its workers (if any did)."""
    from orchestrator.controller import backend_for
    from orchestrator.controller.jobs import read_jobs
    from orchestrator.pricing import load_gpu_table
    from orchestrator.status import status_of

    if launcher is None:
        record, _ = read_jobs(ctx.store, ctx.layout)
        launcher = backend_for(ctx.spec, record.backend) if record.backend else None
    return status_of(
        ctx.store,
        ctx.layout,
        launcher,
        now=time.time(),
        prices=load_gpu_table(prices_path),
        heartbeat_interval=ctx.spec.workers.heartbeat_interval,
        default_spot=ctx.spec.resources.spot,
        gpus=ctx.spec.resources.gpus,
        workers_planned=ctx.spec.workers.count,
    )


@click.command("status")
@common_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable (stable keys)")
@click.option("--watch", is_flag=True, help="redraw every --interval seconds until the run completes")
@click.option("--interval", type=float, default=5.0, show_default=True)
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None, help="GPU price table (YAML)")
def status_command(inv: Invocation, as_json, watch, interval, prices):
    """Show chunks, rows, throughput, ETA, cost and every worker's state."""
    from orchestrator.status import render_table, to_json

    ctx = inv.context()
    while True:
        status = current_status(ctx, prices)
        if as_json:
            click.echo(json.dumps(to_json(status)))
        else:
            if watch and sys.stdout.isatty():
                click.echo("\x1b[H\x1b[2J", nl=False)  # home + clear: redraw in place
            click.echo(render_table(status))
        if not watch or status.complete:
            return 0
        time.sleep(interval)


def register(cli: click.Group) -> None:
    cli.add_command(status_command)

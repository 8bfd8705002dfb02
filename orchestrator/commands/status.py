"""`orch status`: one view of a run; `--watch` redraws it in place, `--json` is for scripts."""

from __future__ import annotations

import contextlib
import json
import time

import click

from orchestrator.commands.shared import Invocation, common_options


@click.command("status")
@common_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable (stable keys)")
@click.option("--watch", is_flag=True, help="redraw every --interval seconds until the run completes")
@click.option("--interval", type=float, default=5.0, show_default=True)
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None, help="GPU price table (YAML)")
def status_command(inv: Invocation, as_json: bool, watch: bool, interval: float, prices: str | None) -> int:
    """Show chunks, rows, throughput, ETA, cost and every worker's state."""
    from orchestrator.commands.console import LiveView, console
    from orchestrator.commands.views import status_view
    from orchestrator.controller.status import current_status, to_json

    ctx = inv.context()
    out = console()
    live = LiveView(out) if watch and not as_json else None
    with live.running() if live else contextlib.nullcontext():
        while True:
            status = current_status(ctx, prices)
            if as_json:
                click.echo(json.dumps(to_json(status)))
            elif live is not None and live.active:
                live.show(status_view(status))
            else:
                out.print(status_view(status))
            if not watch or status.complete:
                return 0
            time.sleep(interval)


def register(cli: click.Group) -> None:
    cli.add_command(status_command)

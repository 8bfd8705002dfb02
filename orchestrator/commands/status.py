"""`orch status`: one view of a run; `--watch` redraws it in place, `--json` is for scripts."""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING

import click

from orchestrator.commands.shared import Invocation, common_options

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext


@click.command("status")
@common_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable (stable keys)")
@click.option("--watch", is_flag=True, help="redraw every --interval seconds until the run completes")
@click.option("--interval", type=float, default=5.0, show_default=True)
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None, help="GPU price table (YAML)")
@click.option("--web", is_flag=True, help="serve the run's web page (and /metrics) on 127.0.0.1 until Ctrl-C")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="--web's port (0: any free one)"
)
def status_command(
    inv: Invocation, as_json: bool, watch: bool, interval: float, prices: str | None, web: bool, port: int
) -> int:
    """Show chunks, rows, throughput, ETA, cost and every worker's state."""
    from orchestrator.commands.console import LiveView, console
    from orchestrator.commands.views import status_view
    from orchestrator.runview.status import current_status, to_json

    ctx = inv.context()
    if web:
        return _serve_web(ctx, prices, port, interval)
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


def _serve_web(ctx: RunContext, prices: str | None, port: int, interval: float) -> int:
    """The page of the run, read at most every --interval seconds, until Ctrl-C."""
    from orchestrator.core.errors import SpecError
    from orchestrator.runview.runs import context_in_store
    from orchestrator.runview.status import current_status
    from orchestrator.web.local import serve_page
    from orchestrator.web.snapshots import Snapshots

    # Any run of the store: the page links to the runs index and its runs' pages.
    snapshots = Snapshots(lambda run: current_status(context_in_store(ctx, run), prices), max_age=interval)
    snapshots.get(ctx.layout.run)  # a run that is not there fails here, not in the browser
    try:
        serve_page(
            snapshots,
            ctx,
            port,
            interval,
            lambda url: click.echo(f"the page of run {ctx.layout.run}: {url} (metrics: /metrics; Ctrl-C stops)"),
        )
    except OSError as e:
        raise SpecError(
            f"cannot listen on 127.0.0.1:{port}: {e.strerror}", where="--port", hint="--port 0 picks a free one"
        ) from None
    except KeyboardInterrupt:
        pass
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(status_command)

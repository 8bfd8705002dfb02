"""`orch prices`: the GPU price table that estimates, status and the deadline policy use.

`--refresh` rebuilds it from SkyPilot's catalog.
"""

from __future__ import annotations

import time

import click


@click.command("prices")
@click.option("--refresh", is_flag=True, help="rebuild the table from SkyPilot's catalog (fetched when reachable)")
@click.option("--clouds", default=None, help="clouds to refresh, comma-separated (default: those in the table)")
@click.option(
    "--prices",
    "prices_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="start from this table instead of the one in use",
)
def prices_command(refresh: bool, clouds: str | None, prices_path: str | None) -> int:
    """Show the GPU prices in use (USD per GPU-hour, spot and on-demand, per cloud) and their date.

    \b
    The table in use: --prices FILE or ORCH_PRICES, else the one `orch prices --refresh` last
    wrote (ORCH_HOME/prices.yaml, ORCH_HOME default ./.orch), else orch's built-in dated table.
    """
    from orchestrator.commands.console import console
    from orchestrator.commands.views import render_gpu_table
    from orchestrator.core.errors import BackendError
    from orchestrator.planning.pricing import load_gpu_table, refreshed_table_path

    table = load_gpu_table(prices_path)
    if not refresh:
        console().print(render_gpu_table(table))
        return 0
    from orchestrator.backends.skypilot_catalog import catalog_offerings
    from orchestrator.planning.pricing import table_from_offerings, write_gpu_table

    wanted = (
        [c.strip().lower() for c in clouds.split(",") if c.strip()]
        if clouds
        else sorted({c for g in table.gpus.values() for c in g.prices})
    )
    offerings, problems = catalog_offerings(list(table.gpus), wanted)
    for cloud, why in problems.items():
        click.echo(
            click.style("warning", fg="yellow") + f": {cloud}: SkyPilot's catalog cannot be read: {why}", err=True
        )
    read = [c for c in wanted if c not in problems]
    if not read:
        raise BackendError(
            f"SkyPilot's catalog could not be read for any of {', '.join(wanted)}: prices stay as in the table "
            f"of {table.date}",
            hint="the catalog is fetched from GitHub on first use; try again where it is reachable",
        )
    fresh = table_from_offerings(
        table,
        offerings,
        date=time.strftime("%Y-%m-%d"),
        source=f"SkyPilot catalog ({', '.join(read)}), cheapest region",
    )
    path = refreshed_table_path()
    write_gpu_table(fresh, path)
    console().print(render_gpu_table(fresh, before=table))
    click.echo(f"wrote {path}: estimates, status and the deadline policy use it from now on")
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(prices_command)

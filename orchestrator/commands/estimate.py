"""`orch estimate`: how long and how much, with p10/p50/p90 bands; `--probe` measures it on the run's own rows first."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, NoReturn

import click

from orchestrator.commands.reports import print_forecast
from orchestrator.commands.shared import SECOND_INTERRUPT_S, Invocation, common_options, run_flags
from orchestrator.core.probe_limits import PROBE_BUDGET_USD, PROBE_SHARE

if TYPE_CHECKING:
    from orchestrator.core.context import RunContext


@click.command("estimate")
@common_options
@click.option("--workers", type=int, default=None, help="number of workers (default: the spec's workers.count)")
@click.option(
    "--probe", is_flag=True, help="answer a stratified sample of the rows on a real worker first, and forecast from it"
)
@click.option(
    "--probe-share",
    type=click.FloatRange(0.0, 0.25),
    default=PROBE_SHARE,
    show_default=True,
    help="share of the rows the probe takes (at least --probe-rows)",
)
@click.option(
    "--probe-rows",
    type=click.IntRange(1),
    default=None,
    help="the fewest rows a probe takes [default: two engine batches (model.engine_args.max_num_seqs, else 256), "
    "one to warm up and one to measure, within 1.5% of the rows]",
)
@click.option(
    "--probe-budget",
    type=click.FloatRange(0.0, min_open=True),
    default=PROBE_BUDGET_USD,
    show_default=True,
    help="USD the probes may spend on SkyPilot, shared by the candidate GPU types (each probed on its own, "
    "spot): a probe past its share is cancelled and its rows are left to the run",
)
@click.option("--json", "as_json", is_flag=True, help="print the forecast as JSON")
def estimate_command(
    inv: Invocation,
    workers: int | None,
    probe: bool,
    probe_share: float,
    probe_rows: int | None,
    probe_budget: float,
    as_json: bool,
) -> int:
    """Forecast the run's duration and cost per candidate (spot and on-demand), p10/p50/p90; kept in the store."""
    from orchestrator.api.estimate import forecast_run

    flags = dict(inv.flags)
    if workers is not None:
        flags["workers.count"] = workers
    ctx = Invocation(inv.spec_file, flags).context(freeze=True)

    def echo(line: str) -> None:  # the probe's progress, with --json too: on SkyPilot it takes minutes
        click.echo(line, err=True)

    try:
        forecast = forecast_run(
            ctx, probe=probe, probe_share=probe_share, probe_rows=probe_rows, probe_budget=probe_budget, echo=echo
        )
    except KeyboardInterrupt:
        _probe_interrupted(ctx)
    if as_json:
        click.echo(json.dumps(forecast.to_dict()))
        return 0
    print_forecast(forecast.to_dict())
    return 0


def _probe_interrupted(ctx: RunContext) -> NoReturn:
    """Ctrl-C while the probe runs: its worker goes on (on SkyPilot, a machine being paid for), and
    says so; the same command waits for it again, and a second Ctrl-C stops it. Exits 130."""
    from orchestrator.backends import backend_for
    from orchestrator.core.records.forecast import read_probes
    from orchestrator.fleet.probe_launch import live_probe_jobs, on

    launcher = backend_for(ctx)
    probes = read_probes(ctx.store, ctx.layout)
    live = live_probe_jobs(launcher, probes)
    running = [p for p in probes if p.chunk in live]
    lines = ["interrupted: `orch estimate` stops here"]
    if running:
        lines.append(
            f"the probe goes on without it on the {launcher.name} backend: "
            + ", ".join(f"job {p.job}{on(p)} answering {p.chunk}" for p in running)
        )
        lines.append(f"  orch estimate {run_flags(ctx)} --probe    waits for it again and forecasts")
    click.echo("\n".join(lines), err=True)
    if running:
        try:  # entered before the prompt: a second Ctrl-C may come the moment it is shown
            click.echo(f"Ctrl-C again within {SECOND_INTERRUPT_S:g}s stops the probe now.", err=True)
            time.sleep(SECOND_INTERRUPT_S)
        except KeyboardInterrupt:
            launcher.cancel([p.job for p in running if p.job is not None])
            click.echo(
                f"stopped the probe ({len(running)} worker(s)); the rows it finished are kept, and "
                "`orch estimate --probe` again resumes its chunk (or the run answers it)",
                err=True,
            )
    raise click.exceptions.Exit(130)


def register(cli: click.Group) -> None:
    cli.add_command(estimate_command)

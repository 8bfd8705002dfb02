"""`orch runs` and `orch logs`: finding a store's runs, and reading a run's worker logs (`orch delete`
is with the commands that stop a run's workers, lifecycle.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from orchestrator.commands.shared import Invocation, common_options

#: The status fields `orch runs --json` gives of each run (then its cost so far and when it was prepared).
RUNS_JSON_FIELDS = ("run", "state", "backend", "model", "input", "chunks", "rows", "forecast")


@click.command("runs")
@click.option("-f", "--file", "spec_file", type=click.Path(dir_okay=False), help="spec file (default: ./orch.yaml)")
@click.option("--store", "store", help="store URI: a directory (default ./.orch), s3://B/P or r2://B/P")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per run, a line each")
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None, help="GPU price table (YAML)")
def runs_command(spec_file: str | None, store: str | None, as_json: bool, prices: str | None) -> int:
    """List the runs in a store: state, chunks and rows done, cost so far, the forecast's error, age."""
    from orchestrator.commands.console import console
    from orchestrator.commands.views import render_runs
    from orchestrator.core.spec_load import load_spec
    from orchestrator.core.store import open_store
    from orchestrator.planning.pricing import load_gpu_table
    from orchestrator.runview.runs import list_runs
    from orchestrator.runview.status import RunStatus, to_json

    spec = load_spec(spec_file, {"store": store} if store else {})
    runs = list_runs(open_store(spec.store, spec.store_settings), load_gpu_table(prices))
    if as_json:
        for r in runs:
            if isinstance(r, RunStatus):
                doc = to_json(r)
                shown = {key: doc[key] for key in RUNS_JSON_FIELDS}
                click.echo(json.dumps({**shown, "cost_usd": r.cost.so_far_usd, "prepared_at": r.prepared_at}))
            else:
                click.echo(json.dumps({"run": r[0], "state": "unreadable", "problem": r[1]}))
        return 0
    if not runs:
        click.echo(f"no runs in {spec.store}")
        return 0
    console().print(render_runs(runs, now=time.time()))
    return 0


@click.command("logs")
@common_options
@click.option("--worker", default=None, help="only this worker's logs (its number)")
@click.option("--follow", is_flag=True, help="print lines as they are written, until the run ends (or Ctrl-C)")
@click.option("--all", "every", is_flag=True, help="every attempt's log, not just each worker's latest")
@click.option("--interval", type=float, default=1.0, show_default=True, help="seconds between reads with --follow")
@click.option(
    "--no-engine",
    "orch_only",
    is_flag=True,
    help="orch's own lines only: the engine's (vLLM's warnings, progress bars) left out, counted",
)
def logs_command(
    inv: Invocation, worker: str | None, follow: bool, every: bool, interval: float, orch_only: bool
) -> int:
    """Print the run's worker logs: each worker's latest (--all: every attempt), then --follow them.

    Each log shows orch's own lines first (what the worker did: chunks, rows, errors, its summary),
    then the engine's (vLLM's warnings, progress bars), which --no-engine leaves out. --follow
    prints lines as they come (with --no-engine, orch's only).

    Local workers log on this machine (`<store>/logs/<run>/`, or ORCH_HOME/logs/<run>/ for an
    s3:// or r2:// store); a SkyPilot worker's log is shown by `sky jobs logs JOB` (orch status
    names the job).
    """
    from orchestrator.core.errors import RunNotFound
    from orchestrator.core.records import read_jobs, read_manifest
    from orchestrator.runview.runs import follow_logs, is_orch_line, latest_logs, log_files, orch_lines_first
    from orchestrator.runview.states import RunState
    from orchestrator.runview.status import current_status

    ctx = inv.context()
    read_manifest(ctx.store, ctx.layout)  # RunNotFound, with its hint, for a run that is not there
    files = log_files(ctx, worker)
    if not files and not follow:
        record, _ = read_jobs(ctx.store, ctx.layout)
        jobs = [f"worker {w}: job {a.job_id}" for w, a in sorted(record.current_jobs().items())]
        hint = (
            f"SkyPilot workers log on their machines: sky jobs logs JOB ({', '.join(jobs)})"
            if record.backend == "skypilot"
            else "launch the run first (orch launch), or check --worker"
        )
        raise RunNotFound(
            f"no worker logs for run {ctx.layout.run!r}" + (f" worker {worker}" if worker else "") + " on this machine",
            hint=hint,
        )
    for path in files if every else sorted(latest_logs(files).values()):
        click.echo(f"==> {path} <==")
        orch, engine = orch_lines_first(path.read_text(errors="replace"))
        click.echo("".join(f"{line}\n" for line in orch), nl=False)
        if engine and orch_only:
            click.echo(f"(and {_lines(len(engine))} of the engine's: orch logs without --no-engine shows them)")
        elif engine:
            click.echo(f"--- the engine's {_lines(len(engine))} (--no-engine leaves them out) ---")
            click.echo("".join(f"{line}\n" for line in engine), nl=False)
    if not follow:
        return 0
    shown: Path | None = None
    try:
        for path, line in follow_logs(
            ctx, worker, lambda: current_status(ctx).state is not RunState.RUNNING, interval=interval
        ):
            if orch_only and not is_orch_line(line):
                continue
            if path != shown:
                click.echo(f"==> {path} <==")
                shown = path
            click.echo(line)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    click.echo(f"run {ctx.layout.run!r} is {current_status(ctx).state}: no worker is writing", err=True)
    return 0


def _lines(n: int) -> str:
    return f"{n:,} line{'' if n == 1 else 's'}"


def register(cli: click.Group) -> None:
    cli.add_command(runs_command)
    cli.add_command(logs_command)

"""`orch simulate`: makespan, cost and the price of preemptions before paying; orch against the SkyPilot example."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from orchestrator.commands.shared import Invocation, common_options

if TYPE_CHECKING:
    from orchestrator.commands.console import Group
    from orchestrator.core.records import ManifestEntry
    from orchestrator.simulate import SimConfig, Summary
    from orchestrator.simulate.spot_score import Grid


@click.command("simulate")
@common_options
@click.option("--workers", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--chunks", type=click.IntRange(min=1), default=200, show_default=True, help="synthetic manifest (or --use-run)"
)
@click.option("--rows-per-chunk", type=click.IntRange(min=1), default=5000, show_default=True)
@click.option("--rows-spread", type=float, default=1.0, show_default=True, help="largest/smallest chunk")
@click.option("--gpus", default=None, help="GPU candidates, drawn uniformly per worker (default: the spec's)")
@click.option("--on-demand", is_flag=True, help="on-demand machines: no preemptions, on-demand prices")
@click.option("--preemptions-per-hour", type=float, default=0.25, show_default=True, help="per spot worker")
@click.option("--trace", type=click.Path(dir_okay=False, exists=True), default=None, help="a preemption trace file")
@click.option(
    "--traces",
    "traces_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="score the spot/deadline policies on the published AWS spot traces unpacked in this folder "
    "(docs/BENCHMARKS.md, spot traces)",
)
@click.option("--quick", is_flag=True, help="with --traces: one restart overhead, 6 single-zone traces per machine")
@click.option(
    "--smoke",
    is_flag=True,
    help="with --traces: the least that runs every setting and policy (one trace per half, one scenario per "
    "availability label, one deadline and restart overhead): that it runs, not figures",
)
@click.option(
    "--randomize",
    is_flag=True,
    help="with --traces: also score the fleet's wait-for-spot rule with its reserve drawn per job (ROSS's "
    "randomization), its cost the mean over --seeds draws per trace",
)
@click.option(
    "--costs",
    type=click.Choice(["orch", "benchmark"]),
    default="orch",
    show_default=True,
    help="with --traces: bill as orch does (one spot price, a zone move is a restart), or as the published "
    "benchmark's simulator does (each zone's listed spot price, at the zone the job ends in; free spot moves)",
)
@click.option(
    "--outages",
    type=int,
    default=0,
    show_default=True,
    help="bursts with no spot capacity at all, on top of the Poisson preemptions",
)
@click.option("--outage-hours", type=float, default=2.0, show_default=True, help="length of each burst")
@click.option(
    "--zones",
    default=None,
    metavar="ZONE=RATE,...",
    help="spot zones, each with its preemptions per hour (replaces --preemptions-per-hour): spot workers "
    "are placed by the zone ranking of real launches (resources.zones)",
)
@click.option(
    "--zone-order",
    type=click.Choice(["ranked", "listed"]),
    default="ranked",
    show_default=True,
    help="with --zones: orch's ranking, or always the first zone listed",
)
@click.option(
    "--restart-overhead",
    type=float,
    default=None,
    help="seconds a machine takes to answer after launch (default: as measured on --run, else 600)",
)
@click.option("--checkpoint-interval", type=float, default=60.0, show_default=True, help="seconds")
@click.option("--lease-ttl", type=float, default=300.0, show_default=True, help="seconds")
@click.option("--base-rows-per-s", type=float, default=1.0, show_default=True, help="an L4's speed")
@click.option(
    "--prefixes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="shared prompt prefixes in the workload (orch groups by them; the example's rows come in input order)",
)
@click.option("--prefix-fraction", type=float, default=0.5, show_default=True, help="a row's work saved by a cache hit")
@click.option("--cache-prefixes", type=click.IntRange(min=1), default=8, show_default=True, help="per worker")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--policy", type=click.Choice(["orch", "skypilot-example"]), default="orch", show_default=True)
@click.option("--compare", is_flag=True, help="both policies on the same seeds and traces")
@click.option(
    "--deadline-factor",
    type=float,
    default=None,
    help="compare on-demand only, spot only, greedy and the deadline policy, with the deadline at this "
    "multiple of each seed's on-demand makespan",
)
@click.option("--use-run", is_flag=True, help="simulate the manifest of --run instead of a synthetic one")
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None)
@click.option("--json", "as_json", is_flag=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="write a Gantt chart (PNG)")
def simulate_command(
    inv: Invocation,
    seeds: int,
    policy: str,
    compare: bool,
    deadline_factor: float | None,
    use_run: bool,
    as_json: bool,
    plot_path: str | None,
    traces_dir: str | None,
    quick: bool,
    smoke: bool,
    randomize: bool,
    costs: str,
    **knobs: Any,
) -> int:
    """Simulate a run: how long, how much, what preemptions cost (driving orch's own protocol code)."""
    # `knobs`: the options that describe the fleet and the workload (_sim_config reads them).
    from orchestrator.simulate import MARKETS, POLICIES

    if traces_dir is not None:
        from orchestrator.simulate.spot_policies import RANDOMIZED
        from orchestrator.simulate.spot_score import Grid
        from orchestrator.simulate.spot_traces import COST_MODELS

        grid = Grid(quick, smoke, draws={RANDOMIZED: seeds if randomize else 0}, costs=COST_MODELS[costs])
        return _spot_traces(traces_dir, grid, as_json)
    knobs["restart_overhead"] = _startup_s(inv, knobs["restart_overhead"], measured=use_run or "run" in inv.flags)
    config = _sim_config(**knobs)
    entries = None
    if use_run:
        from orchestrator.core.records import read_manifest

        ctx = inv.context()
        entries = read_manifest(ctx.store, ctx.layout)
    names = list(POLICIES) if compare else [policy]
    runs = seeds * (len(MARKETS) if deadline_factor is not None else len(names))
    _warn_if_long(config, entries, seeds, runs)
    if deadline_factor is not None:
        return _deadline_study(config, seeds, deadline_factor, entries, as_json)
    return _policy_study(config, names, seeds, entries, as_json, plot_path)


def _startup_s(inv: Invocation, given: float | None, *, measured: bool) -> float:
    """A machine's start-up: --restart-overhead, else what the run measured (its workers' median
    from launch to first answer, as its estimate and deadline use), else the default; said on
    stderr, with where it came from (--json output stays clean)."""
    from orchestrator.planning.estimate import RESTART_OVERHEAD_S
    from orchestrator.planning.startup import measured_startup_s

    if given is not None:
        seconds, source = given, "--restart-overhead"
    elif measured:
        ctx = inv.context()
        found = measured_startup_s(ctx.store, ctx.layout)
        seconds = found if found is not None else RESTART_OVERHEAD_S
        source = (
            f"measured on run {ctx.layout.run!r}: its workers' median from launch to first answer"
            if found is not None
            else f"default: no worker of run {ctx.layout.run!r} has answered yet"
        )
    else:
        seconds, source = RESTART_OVERHEAD_S, "default; --run NAME uses the start-up a run measured"
    click.echo(f"start-up per machine: {seconds:,.0f} s ({source})", err=True)
    return seconds


def _sim_config(
    *,
    gpus: str | None,
    on_demand: bool,
    preemptions_per_hour: float,
    outage_hours: float,
    restart_overhead: float,
    checkpoint_interval: float,
    lease_ttl: float,
    zones: str | None,
    **same: Any,
) -> SimConfig:
    """The simulation's configuration from the options; `same`: options named as SimConfig's fields
    (workers, chunks, rows_per_chunk, rows_spread, trace, base_rows_per_s, prices, outages, prefixes,
    prefix_fraction, cache_prefixes, zone_order)."""
    from orchestrator.simulate import SimConfig

    return SimConfig(
        gpus=[g.strip() for g in gpus.split(",")] if gpus else SimConfig().gpus,
        spot=not on_demand,
        preemptions_per_hour=0 if on_demand else preemptions_per_hour,
        restart_overhead_s=restart_overhead,
        checkpoint_interval_s=checkpoint_interval,
        lease_ttl_s=lease_ttl,
        outage_s=outage_hours * 3600,
        zones=_zone_rates(zones) if zones else {},
        **same,
    )


def _zone_rates(text: str) -> dict[str, float]:
    """`aws/us-east-1/us-east-1a=2,aws/us-east-1/us-east-1b=0.05` -> zone: preemptions per hour."""
    rates = {}
    for item in text.split(","):
        zone, _, rate = item.strip().partition("=")
        try:
            rates[zone] = float(rate)
        except ValueError:
            raise click.BadParameter(f"{item!r}: write ZONE=PREEMPTIONS_PER_HOUR", param_hint="--zones") from None
    return rates


def _policy_study(
    config: SimConfig,
    names: list[str],
    seeds: int,
    entries: Sequence[ManifestEntry] | None,
    as_json: bool,
    plot_path: str | None,
) -> int:
    """Each policy over the seeds: the summary table (or JSON), and the Gantt chart of seed 0."""
    from orchestrator.commands.console import console
    from orchestrator.simulate import POLICIES, simulate, summarise

    results = {
        name: [simulate(config, POLICIES[name], seed, entries=entries) for seed in range(seeds)] for name in names
    }
    summaries = {name: summarise(rs) for name, rs in results.items()}
    if plot_path:
        from orchestrator.simulate.plot import plot_gantt

        plot_gantt([rs[0] for rs in results.values()], plot_path)
    if as_json:
        click.echo(
            json.dumps({"config": config.model_dump(), "policies": {n: asdict(s) for n, s in summaries.items()}})
        )
        return 0
    console().print(render(summaries, config, seeds))
    if plot_path:
        click.echo(f"Gantt chart of seed 0: {plot_path}")
    return 0


#: Runs expected to take longer than this are announced, with the faster settings.
LONG_RUN_S = 60.0


def _warn_if_long(config: SimConfig, entries: Sequence[ManifestEntry] | None, seeds: int, runs: int) -> None:
    """Say up front how long a large simulation takes (on stderr: --json output stays clean)."""
    from orchestrator.simulate import estimate_seconds

    if entries:  # the run's own chunks
        rows = sum(e.rows for e in entries) // len(entries)
        config = config.model_copy(update={"chunks": len(entries), "rows_per_chunk": rows})
    total = estimate_seconds(config, runs)
    if total <= LONG_RUN_S:
        return
    per_seed = total / seeds
    lines = [f"{config.workers:,} workers x {config.chunks:,} chunks, {seeds} seed(s): about {_duration(total)}."]
    if seeds > 1:
        lines.append(f"  --seeds 1: about {_duration(per_seed)} (one seed's figures, no spread over seeds)")
    if config.rows_per_chunk > 500:
        small = config.model_copy(update={"rows_per_chunk": 500})
        lines.append(
            f"  --seeds 1 --rows-per-chunk 500: about {_duration(estimate_seconds(small, runs // seeds))} "
            "(a smaller workload: shorter chunks make a shorter end game)"
        )
    click.echo("\n".join(lines), err=True)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _deadline_study(
    config: SimConfig, seeds: int, factor: float, entries: Sequence[ManifestEntry] | None, as_json: bool
) -> int:
    import statistics

    from orchestrator.simulate import deadline_study

    if factor < 1:
        raise click.BadParameter(
            "a deadline shorter than the on-demand makespan cannot be met", param_hint="--deadline-factor"
        )
    results = deadline_study(config, seeds, factor, entries=entries)
    od = results["on-demand only"]
    rows = {}
    for market, runs in results.items():
        rows[market] = {
            "deadline_met": sum(bool(r.met_deadline) for r in runs),
            "runs": len(runs),
            "cost_usd": statistics.fmean(r.cost_usd for r in runs),
            "cost_vs_on_demand": statistics.fmean(r.cost_usd / o.cost_usd for r, o in zip(runs, od, strict=True)),
            "makespan_vs_deadline": statistics.fmean(r.makespan_vs_deadline for r in runs),
            "makespan_vs_deadline_max": max(r.makespan_vs_deadline for r in runs),
            "on_demand_launched": statistics.fmean(r.on_demand_launched for r in runs),
            "on_demand_added_gpu_h": statistics.fmean(r.on_demand_gpu_h for r in runs),
        }
    if as_json:
        click.echo(json.dumps({"config": config.model_dump(), "deadline_factor": factor, "markets": rows}))
        return 0
    from orchestrator.commands.console import Group, Text, console, table

    trace = f"{config.preemptions_per_hour:g} preemptions/h" + (
        f" + {config.outages} outage(s) of {config.outage_s / 3600:g} h" if config.outages else ""
    )
    numbers = ("deadline met", "cost (USD)", "x on-demand", "makespan/deadline", "on-demand added", "their GPU-h")
    grid = table("", *numbers, right=numbers)
    for market, r in rows.items():
        grid.add_row(
            market,
            f"{r['deadline_met']}/{r['runs']}",
            f"{r['cost_usd']:,.2f}",
            f"{r['cost_vs_on_demand']:.2f}",
            f"{r['makespan_vs_deadline']:.2f} (max {r['makespan_vs_deadline_max']:.2f})",
            f"{r['on_demand_launched']:.1f}",
            f"{r['on_demand_added_gpu_h']:.1f}",
        )
    head = (
        f"{config.workers} workers, {config.chunks} chunks x {config.rows_per_chunk} rows, {trace}, deadline "
        f"{factor:g}x the on-demand makespan, {seeds} seed(s)"
    )
    console().print(Group(Text(head), grid))
    return 0


def _spot_traces(folder: str, grid: Grid, as_json: bool) -> int:
    """The spot/deadline policies scored on the published traces: one table per setting. With draws of
    the randomized wait-for-spot rule in `grid`, that rule too, its cost the mean of its seeded replays per run."""
    from pathlib import Path

    from orchestrator.commands.console import Group, Text, console, table
    from orchestrator.simulate.spot_policies import POLICIES as SPOT_POLICIES
    from orchestrator.simulate.spot_policies import RANDOMIZED, wait_for_spot_randomized
    from orchestrator.simulate.spot_score import SETTINGS, score

    draws = (grid.draws or {}).get(RANDOMIZED, 0)
    policies = {**SPOT_POLICIES, RANDOMIZED: wait_for_spot_randomized} if draws else SPOT_POLICIES
    result = score(Path(folder), policies, grid)
    if as_json:
        click.echo(json.dumps(result))
        return 0
    parts: list[Any] = [Text(f"traces: {result['meaning']}; cost model: {result['cost_model']}")]
    scenarios = table("scenario", "zones", "availability", "any zone up", right=("availability", "any zone up"))
    for name, s in result["scenarios"].items():
        scenarios.add_row(name, ", ".join(s["zones"]), f"{s['availability']:.0%}", f"{s['any_zone_up']:.0%}")
    parts.append(scenarios)
    numbers = ("missed", "x on-demand", "vs UP", "vs UP round robin", "gap to optimum", "held-out: vs UP, gap")
    for setting in SETTINGS:
        rows = table(f"{setting} variant", "policy", *numbers, right=numbers)
        blocks = {**result[setting]["variants"], "total": result[setting]["total"]}
        for variant, block in blocks.items():
            rows.add_row(variant, "optimum", "", f"{block['optimum_cost_vs_on_demand']:.3f}", "", "", "", "")
            for name, m in block["policies"].items():
                held = m["halves"].get("held-out", m)
                rows.add_row(
                    "",
                    name,
                    f"{m['missed_deadlines']}/{m['runs']}",
                    f"{m['cost_vs_on_demand']:.3f}",
                    f"{m['saving_vs_up']:.1%}",
                    f"{m['saving_vs_up_round_robin']:.1%}",
                    f"{m['gap_to_optimum']:.1%}",
                    f"{held['saving_vs_up']:.1%}, {held['gap_to_optimum']:.1%}",
                )
        parts.append(rows)
    parts.append(Text("savings: 1 - mean cost / the baseline's on the same runs (UP: the paper's Uniform Progress)"))
    console().print(Group(*parts))
    return 0


def render(summaries: dict[str, Summary], config: SimConfig, seeds: int) -> Group:
    """One column per policy, one row per measure."""
    from orchestrator.commands.console import Group, Text, table

    rows: list[tuple[str, Callable[[Summary], str]]] = [
        ("makespan (h, mean)", lambda s: f"{s.makespan_h:.2f}"),
        ("makespan (h, min-max)", lambda s: f"{s.makespan_h_min:.2f}-{s.makespan_h_max:.2f}"),
        ("lower bound (h)", lambda s: f"{s.lower_bound_h:.2f}"),
        ("makespan / lower bound", lambda s: f"{s.ratio:.3f} (max {s.ratio_max:.3f})"),
        ("GPU-hours billed", lambda s: f"{s.billed_gpu_h:.1f}"),
        ("GPU-hours wasted", lambda s: f"{s.wasted_gpu_h:.1f} ({s.lost_gpu_h:.1f} lost work)"),
        ("idle tail GPU-hours (not billed)", lambda s: f"{s.idle_tail_gpu_h:.1f}"),
        ("cost (USD)", lambda s: f"{s.cost_usd:,.2f}"),
        ("preemptions / rescues", lambda s: f"{s.preemptions:.1f} / {s.rescues:.1f}"),
        ("runs complete", lambda s: f"{s.complete}/{s.runs}"),
    ]
    names = list(summaries)
    grid = table("", *names, right=tuple(names))
    for label, fmt in rows:
        grid.add_row(label, *(fmt(summaries[n]) for n in names))
    head = (
        f"{config.workers} workers ({', '.join(config.gpus)}; {'spot' if config.spot else 'on-demand'}), "
        f"{config.chunks} chunks x {config.rows_per_chunk} rows, {seeds} seed(s)"
    )
    return Group(Text(head), grid)


def register(cli: click.Group) -> None:
    cli.add_command(simulate_command)

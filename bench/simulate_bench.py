"""The fleet simulator's figures (issues 5 and 6), each side by side on the same seeds and traces.

1. orch against the SkyPilot example: 16 workers, 200 chunks of 5,000 conversations, GPUs uniform
   over L4/A10G/L40S/A100/A100-80GB, a preemption per worker every 4 hours on average, 10-minute
   restarts, 20 seeds. Target: orch's makespan at most 1.10x the lower bound on average.
2. Scale: 1,000 workers over 1,000, 10,000 and 100,000 chunks of 500 rows, one seed, side by side,
   each `orch simulate` in its own process (wall time and its own peak RSS). Targets: 100,000
   chunks in under 60 s and 1 GiB; time per chunk growing no faster than log(chunks).
3. Deadlines: on-demand only, spot only, greedy and the deadline policy, with the deadline at 2x
   (and 1.3x) each seed's on-demand makespan, over Poisson traces and traces with bursts of no spot
   capacity. Targets: the deadline met in every run (on-demand alone meets it by construction);
   cost at most 0.5x on-demand only on average at 2x.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import ROOT, save, sized, table

SECTIONS = ("compare", "scale", "deadlines")


def simulate_once(workers: int, chunks: int) -> dict[str, Any]:
    """`orch simulate --seeds 1` in a child process: wall seconds, its own peak RSS (wait4), its summary."""
    cmd = [sys.executable, "-m", "orchestrator", "simulate", "--workers", str(workers), "--chunks", str(chunks)]
    cmd += ["--seeds", "1", "--rows-per-chunk", "500", "--json"]
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        if os.waitstatus_to_exitcode(status):
            raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), cmd)
        out.seek(0)
        summary = json.loads(out.read())["policies"]["orch"]
    assert summary["complete"] == 1, summary
    return {"chunks": chunks, "seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024), **summary}


def scale() -> dict[str, Any]:
    """Three sizes side by side. Growth: each size's simulation time (wall less the start-up of a
    1-worker, 1-chunk run) over the previous size's, divided by what n log n allows for that step
    (10 x log(10n)/log(n)): at most 1 when the cost grows as chunks x log(chunks)."""
    workers, sizes = sized((1_000, (1_000, 10_000, 100_000)), (200, (200, 2_000, 20_000)), (10, (20, 200, 2_000)))
    startup = simulate_once(1, 1)["seconds"]
    rows = [simulate_once(workers, n) for n in sizes]
    for prev, r in zip([None, *rows], rows, strict=False):
        r["simulation_s"] = round(max(r["seconds"] - startup, 0.1), 1)
        if prev is not None:
            allowed = r["chunks"] * math.log(r["chunks"]) / (prev["chunks"] * math.log(prev["chunks"]))
            r["growth_vs_n_log_n"] = round(r["simulation_s"] / prev["simulation_s"] / allowed, 3)
    print(f"\n2. {workers:,} workers, chunks of 500 rows, one seed, each size its own process")
    print(
        table(
            [
                [
                    r["chunks"],
                    r["seconds"],
                    r["simulation_s"],
                    r.get("growth_vs_n_log_n", "-"),
                    r["peak_rss_mib"],
                    r["ratio"],
                ]
                for r in rows
            ],
            ["chunks", "wall s", "simulation s", "step / n log n", "peak RSS MiB", "x lower bound"],
        )
    )
    big = rows[-1]
    print(
        f"   start-up {startup:.1f} s; {big['chunks']:,} chunks: {big['seconds']:.1f} s (target < 60 s), "
        f"{big['peak_rss_mib']:,} MiB (target < 1,024); growth per 10x at most "
        f"{max(r['growth_vs_n_log_n'] for r in rows[1:]):.2f}x what n log n allows (target <= 1)"
    )
    return {"workers": workers, "startup_s": startup, "sizes": rows, "target_s": 60, "target_rss_mib": 1024}


def main() -> None:
    """Usage: python -m bench.simulate_bench [--quick] [compare|scale|deadlines ...] (default: all three)."""
    from orchestrator.simulate import POLICIES, SimConfig, deadline_study, simulate, summarise

    selected = [a for a in sys.argv[1:] if not a.startswith("-")] or list(SECTIONS)
    unknown = set(selected) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    seeds = sized(20, 5, 1)
    results: dict[str, Any] = {"seeds": seeds}
    if "compare" in selected:
        # 1. orch vs the SkyPilot example.
        config = SimConfig()
        summaries = {
            name: summarise([simulate(config, policy, s) for s in range(seeds)]) for name, policy in POLICIES.items()
        }
        print(
            f"1. {config.workers} workers, {config.chunks} chunks x {config.rows_per_chunk} rows, "
            f"{config.preemptions_per_hour:g} preemptions/worker-hour, {seeds} seeds"
        )
        print(
            table(
                [
                    [n, s.makespan_h, s.ratio, s.ratio_max, s.wasted_gpu_h, s.lost_gpu_h, s.idle_tail_gpu_h, s.cost_usd]
                    for n, s in summaries.items()
                ],
                [
                    "policy",
                    "makespan h",
                    "x lower bound",
                    "max",
                    "wasted GPU-h",
                    "lost work GPU-h",
                    "idle tail GPU-h",
                    "cost USD",
                ],
            )
        )
        orch, sky = summaries["orch"], summaries["skypilot-example"]
        print(
            f"   orch: {orch.ratio:.3f}x the lower bound (target <= 1.10); the SkyPilot example: {sky.ratio:.2f}x, "
            f"{sky.makespan_h / orch.makespan_h:.2f}x orch's makespan, "
            f"{sky.wasted_gpu_h / max(orch.wasted_gpu_h, 1e-9):.1f}x "
            "its wasted GPU-hours"
        )
        results["orch_vs_skypilot_example"] = {
            n: {k: round(v, 3) if isinstance(v, float) else v for k, v in vars(s).items()} for n, s in summaries.items()
        }
        results["target_orch_ratio"] = 1.10
    if "scale" in selected:
        results["scale"] = scale()
    if "deadlines" in selected:
        # 3. Deadlines.
        outage = SimConfig(outages=1, outage_s=2 * 3600)
        scenarios = {
            "2x, poisson 0.25/h": (2.0, SimConfig()),
            "2x, poisson 0.25/h + one 2 h outage": (2.0, outage),
            "2x, poisson 1/h + two 4 h outages": (
                2.0,
                SimConfig(preemptions_per_hour=1.0, outages=2, outage_s=4 * 3600, outage_window_s=10 * 3600),
            ),
            "1.3x, poisson 0.25/h + one 2 h outage": (1.3, outage),
        }
        deadlines = {}
        print(f"\n3. deadline = a multiple of each seed's on-demand makespan, {seeds} seeds")
        for label, (factor, cfg) in scenarios.items():
            runs = deadline_study(cfg, seeds, factor)
            od = runs["on-demand only"]
            rows = {}
            for market, rs in runs.items():
                rows[market] = {
                    "missed": sum(not r.met_deadline for r in rs),
                    "cost_vs_on_demand": round(
                        statistics.fmean(r.cost_usd / o.cost_usd for r, o in zip(rs, od, strict=True)), 3
                    ),
                    "makespan_vs_deadline_max": round(max(r.makespan_vs_deadline for r in rs), 3),
                    "on_demand_launched": round(statistics.fmean(r.on_demand_launched for r in rs), 1),
                }
            deadlines[label] = rows
            print(f"   {label}")
            print(
                table(
                    [
                        [
                            m,
                            f"{r['missed']}/{seeds}",
                            r["cost_vs_on_demand"],
                            r["makespan_vs_deadline_max"],
                            r["on_demand_launched"],
                        ]
                        for m, r in rows.items()
                    ],
                    ["market", "missed", "cost x on-demand", "max makespan/deadline", "on-demand added"],
                )
            )
        results["deadlines"] = deadlines
        results["targets_deadline"] = {"missed": 0, "cost_vs_on_demand": 0.5}
    save("simulate_bench", results)


if __name__ == "__main__":
    main()

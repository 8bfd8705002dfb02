"""The fleet simulator's figures (issues 5 and 6), each side by side on the same seeds and traces.

1. orch against the SkyPilot example: 16 workers, 200 chunks of 5,000 conversations, GPUs uniform
   over L4/A10G/L40S/A100/A100-80GB, a preemption per worker every 4 hours on average, 10-minute
   restarts, 20 seeds. Target: orch's makespan at most 1.10x the lower bound on average.
2. Scale: 1,000 workers over 100,000 chunks, one seed, wall time. Target: under 60 s.
3. Deadlines: on-demand only, spot only, greedy and the deadline policy, with the deadline at 2x
   (and 1.3x) each seed's on-demand makespan, over Poisson traces and traces with bursts of no spot
   capacity. Targets: the deadline met in every run (on-demand alone meets it by construction);
   cost at most 0.5x on-demand only on average at 2x.
"""

from __future__ import annotations

import statistics
import sys
import time

from bench.common import save, table


def main() -> None:
    from orchestrator.simulate import ORCH, POLICIES, SimConfig, deadline_study, simulate, summarise

    quick = "--quick" in sys.argv
    seeds = 5 if quick else 20

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

    # 2. Scale.
    workers, chunks = (200, 20_000) if quick else (1_000, 100_000)
    big = SimConfig(workers=workers, chunks=chunks, rows_per_chunk=500)
    started = time.perf_counter()
    result = simulate(big, ORCH, 0)
    scale_s = time.perf_counter() - started
    assert result.complete and result.markers == chunks
    print(
        f"\n2. {workers:,} workers x {chunks:,} chunks: simulated in {scale_s:.1f} s (target < 60 s); "
        f"makespan {result.ratio:.3f}x the lower bound"
    )

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

    save(
        "simulate_bench",
        {
            "seeds": seeds,
            "orch_vs_skypilot_example": {
                n: {k: round(v, 3) if isinstance(v, float) else v for k, v in vars(s).items()}
                for n, s in summaries.items()
            },
            "target_orch_ratio": 1.10,
            "scale": {"workers": workers, "chunks": chunks, "seconds": round(scale_s, 1), "target_s": 60},
            "deadlines": deadlines,
            "targets_deadline": {"missed": 0, "cost_vs_on_demand": 0.5},
        },
    )


if __name__ == "__main__":
    main()

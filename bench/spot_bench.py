"""Spot and deadlines on the published AWS traces (issues 37, 52): orch's policies against the published baselines.

The traces ("Can't Be Late", NSDI'24, as packaged by the Frontier-CS benchmark) are data, not code:
two archives in $ORCH_SPOT_TRACES (default ../shared/data/spot-traces beside the repository),
unpacked once into .cache/spot-traces. Then `orch simulate --traces .cache/spot-traces --json`
scores every policy on the multi-zone benchmark's 8 variants, the single-zone grid and ADRS's
multi-region setting, under orch's cost model; with `--benchmark-costs`, under the published
simulator's (`--costs benchmark`: each zone's listed spot price, free spot-to-spot moves), saved
apart (bench/results/spot_bench_benchmark_costs.json).

Savings are quoted against the paper's Uniform Progress (UP, sky_spot's rc_cr_threshold): with
failover across zones (it sees every zone) for `zone-aware`, round robin (it sees its own zone)
for `own-zone`. Targets (issue 52, orch's cost model): 0 missed deadlines everywhere; single zone:
zone-aware >= 7% below UP and <= 10% from the optimum in every variant; multi-zone: zone-aware
>= 5% below UP with failover, own-zone >= 9% below round-robin UP; ADRS setting: own-zone >= 15%
below round-robin UP (reported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE, QUICK, ROOT, save, sized, table

ARCHIVES = ("multi-region-v100.tar.gz", "single-region.tar.gz")
TRACES = CACHE.parent / "spot-traces"


def unpacked() -> Path:
    """The traces folder, unpacked from the archives on first use."""
    source = Path(os.environ.get("ORCH_SPOT_TRACES", ROOT.parent / "shared" / "data" / "spot-traces"))
    TRACES.mkdir(parents=True, exist_ok=True)
    for name, folder in zip(ARCHIVES, ("converted_multi_region_aligned", "real"), strict=True):
        if not (TRACES / folder).is_dir():
            if not (source / name).is_file():
                raise SystemExit(f"{source / name}: not found; set ORCH_SPOT_TRACES to the folder holding {ARCHIVES}")
            tar = ["tar", "xzf", str(source / name), "--warning=no-unknown-keyword", "--exclude=._*"]
            subprocess.run([*tar, "-C", str(TRACES)], check=True)
    return TRACES


def main() -> None:
    size = sized([], ["--quick"], ["--smoke"])  # the simulator's own sizes: --smoke is its least run
    costs = "benchmark" if "--benchmark-costs" in sys.argv else "orch"
    folder = unpacked()
    cmd = [sys.executable, "-m", "orchestrator", "simulate", "--traces", str(folder), "--json", "--costs", costs]
    started = time.monotonic()
    out = subprocess.run([*cmd, *size], cwd=ROOT, check=True, capture_output=True)
    seconds = time.monotonic() - started
    result: dict[str, Any] = json.loads(out.stdout)
    print(f"{result['meaning']}; cost model {result['cost_model']}; scored in {seconds:.0f} s")
    print(
        table(
            [
                [n, s["label"], f"{s['availability']:.0%}", f"{s['any_zone_up']:.0%}"]
                for n, s in result["scenarios"].items()
            ],
            ["scenario", "benchmark's label", "measured availability", "any zone up"],
        )
    )
    for setting in ("multi-zone", "single-zone", "adrs-multi-zone"):
        blocks = {**result[setting]["variants"], "total": result[setting]["total"]}
        rows = []
        for variant, block in blocks.items():
            for name, m in block["policies"].items():
                held = m["halves"].get("held-out", m)
                rows.append(
                    [
                        variant,
                        name,
                        f"{m['missed_deadlines']}/{m['runs']}",
                        round(m["cost_vs_on_demand"], 3),
                        f"{m['saving_vs_up']:.1%} ({held['saving_vs_up']:.1%})",
                        f"{m['saving_vs_up_round_robin']:.1%} ({held['saving_vs_up_round_robin']:.1%})",
                        f"{m['gap_to_optimum']:.1%} ({held['gap_to_optimum']:.1%})",
                    ]
                )
            rows.append([variant, "optimum", "", round(block["optimum_cost_vs_on_demand"], 3), "", "", ""])
        print(f"\n{setting} (held-out half in brackets)")
        header = ["variant", "policy", "missed", "x on-demand", "vs UP failover", "vs UP round robin", "gap to opt"]
        print(table(rows, header))
    name = "spot_bench" if costs == "orch" else "spot_bench_benchmark_costs"
    save(name, {"seconds": round(seconds, 1), "quick": QUICK, **result})


if __name__ == "__main__":
    main()

"""Spot and deadlines on the published AWS traces (issue 37): orch's policies against Uniform Progress and the optimum.

The traces ("Can't Be Late", NSDI'24, as packaged by the Frontier-CS benchmark) are data, not code:
two archives in $ORCH_SPOT_TRACES (default ../shared/data/spot-traces beside the repository),
unpacked once into .cache/spot-traces. Then `orch simulate --traces .cache/spot-traces --json`
scores every policy on the multi-zone benchmark's 8 variants and the single-zone grid.

Targets: 0 missed deadlines everywhere; multi-zone mean cost >= 27% below Uniform Progress and
within 10% of the hindsight optimum (>= 20% below UP on the held-out half); single zone >= 7%
below UP; the whole scorer within 10 minutes on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE, QUICK, ROOT, SMOKE, save, table

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
    quick = QUICK or SMOKE  # the simulator's own --quick is its smallest run
    folder = unpacked()
    cmd = [sys.executable, "-m", "orchestrator", "simulate", "--traces", str(folder), "--json"]
    started = time.monotonic()
    out = subprocess.run([*cmd, *(["--quick"] if quick else [])], cwd=ROOT, check=True, capture_output=True)
    seconds = time.monotonic() - started
    result: dict[str, Any] = json.loads(out.stdout)
    print(f"{result['meaning']}; scored in {seconds:.0f} s (target <= 600 s)")
    print(
        table(
            [
                [n, s["label"], f"{s['availability']:.0%}", f"{s['any_zone_up']:.0%}"]
                for n, s in result["scenarios"].items()
            ],
            ["scenario", "benchmark's label", "measured availability", "any zone up"],
        )
    )
    for setting in ("multi-zone", "single-zone"):
        blocks = {**result[setting]["variants"], "total": result[setting]["total"]}
        rows = []
        for variant, block in blocks.items():
            for name, m in block["policies"].items():
                held = m["halves"]["held-out"]
                rows.append(
                    [
                        variant,
                        name,
                        f"{m['missed_deadlines']}/{m['runs']}",
                        round(m["cost_vs_on_demand"], 3),
                        f"{m['saving_vs_up']:.1%}",
                        f"{m['gap_to_optimum']:.1%}",
                        f"{held['saving_vs_up']:.1%}",
                        f"{held['gap_to_optimum']:.1%}",
                    ]
                )
            rows.append([variant, "optimum", "", round(block["optimum_cost_vs_on_demand"], 3), "", "", "", ""])
        print(f"\n{setting}")
        header = ["variant", "policy", "missed", "x on-demand", "saving vs UP", "gap to opt", "held-out saving", "gap"]
        print(table(rows, header))
    save("spot_bench", {"seconds": round(seconds, 1), "quick": quick, **result})


if __name__ == "__main__":
    main()

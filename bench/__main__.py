"""`make bench`: every benchmark, each in the environment it needs, each measured side by side in one run.

Results land in bench/results/<name>.json; docs/BENCHMARKS.md explains them.
Usage: python -m bench [--quick] [NAME ...]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROLLER = ROOT / ".venv" / "bin" / "python"
WORKER = ROOT / ".venv-worker" / "bin" / "python"

#: name -> the Python that runs it (the worker's benchmarks need its engines; the rest the controller's).
BENCHMARKS = {
    "prepare_bench": CONTROLLER,
    "check_bench": CONTROLLER,
    "schema_bench": CONTROLLER,
    "plan_bench": CONTROLLER,
    "status_bench": CONTROLLER,
    "launch_bench": CONTROLLER,
    "simulate_bench": CONTROLLER,
    "spot_bench": CONTROLLER,
    "table_sources_bench": CONTROLLER,
    "reuse_bench": CONTROLLER,
    "grown_table_bench": CONTROLLER,
    # Runs workers (the worker's environment) through the controller's CLI.
    "forecast_bench": CONTROLLER,
    "worker_bench": WORKER,
    "prefix_bench": WORKER,
    # Drives `orch run` (local workers in the worker's environment) from the controller's.
    "models_bench": CONTROLLER,
    "sweep_bench": CONTROLLER,
    # On a CPU, a smoke run of `make bench-gpu` and the transformers engine's CPU target.
    "gpu_bench": WORKER,
}
#: Benchmarks `make bench` leaves out, each run by hand where it means something (docs/BENCHMARKS.md):
#: the forecast study on a GPU machine without vLLM (on a CPU only a smoke run of the script).
BY_HAND = {"forecast_gpu_bench": CONTROLLER}


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    names = [a for a in argv if not a.startswith("-")] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        python = BENCHMARKS[name]
        print(f"\n=== {name} ({python.parent.parent.name}) ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([str(python), "-m", f"bench.{name}", *(["--quick"] if quick else [])], cwd=ROOT)
        print(f"=== {name}: exit {code} in {time.monotonic() - started:.0f}s ===", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

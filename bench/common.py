"""Shared by the benchmarks: where results go, how they are printed, the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CACHE = ROOT / ".cache" / "bench"
#: `--smoke`: a benchmark's smallest run, to show that it still runs (tests/test_bench_smoke.py runs
#: every one so): seconds, its figures printed and not saved over bench/results.
SMOKE = "--smoke" in sys.argv[1:]
#: `--quick`: smaller workloads, figures saved (each benchmark's docstring says how small).
QUICK = "--quick" in sys.argv[1:]
Size = TypeVar("Size")


def sized(full: Size, quick: Size, smoke: Size) -> Size:
    """The workload size of this run: `--smoke`'s, `--quick`'s, or the benchmark's own."""
    return smoke if SMOKE else quick if QUICK else full


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def save(name: str, result: dict[str, Any]) -> Path | None:
    """The result in bench/results/<name>.json (a smoke run's only printed)."""
    if SMOKE:
        print(f"smoke run of {name}: nothing saved")
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2))
    print(f"-> {path.relative_to(ROOT)}")
    return path


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A benchmark's results as text: numbers right-aligned, thousands separated (orch's own table style)."""
    from orchestrator.commands.console import table as grid
    from orchestrator.commands.console import to_text

    out = grid(*header, right=tuple(header[1:]))
    for row in rows:
        out.add_row(*(f"{c:,.3f}" if isinstance(c, float) else f"{c:,}" if isinstance(c, int) else str(c) for c in row))
    return to_text(out)

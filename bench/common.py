"""Shared by the benchmarks: where results go, how they are printed, the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CACHE = ROOT / ".cache" / "bench"


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def save(name: str, result: dict[str, Any]) -> Path:
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

"""Every benchmark still runs: its smallest run (`--smoke`, nothing saved), in the environment `make bench`
gives it. A benchmark whose figures need vLLM itself is of the real-engine tier; one that drives `orch
run` runs its workers on the scripted engine here, as every test not marked `real_engine` does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, BY_HAND
from tests.support.cli import env_with
from tests.support.models import REPO

#: Benchmarks slower than a few seconds even at their smallest: local workers through `orch run`, or
#: vLLM itself (the real-engine tier: their figures are the engine's).
SLOW = {"forecast_bench", "forecast_gpu_bench", "models_bench", "sweep_bench", "launch_bench", "simulate_bench"}
SLOW |= {"reuse_bench", "prepare_bench", "table_sources_bench", "spot_bench", "schema_bench"}
#: Every benchmark, and the Python it runs on.
EVERY = {**BENCHMARKS, **BY_HAND}
REAL_ENGINE = {"prefix_bench", "gpu_bench"}
#: Where spot_bench reads the published traces (as tests/test_spot_traces.py: ../shared beside the repository).
SPOT_TRACES = Path(os.environ.get("ORCH_SPOT_TRACES", REPO.parent / "shared" / "data" / "spot-traces"))


def smoke_params() -> list[object]:
    params: list[object] = []
    for name in EVERY:
        marks = [pytest.mark.slow] if name in SLOW | REAL_ENGINE else []
        if name in REAL_ENGINE:
            marks.append(pytest.mark.real_engine)
        params.append(pytest.param(name, (), marks=marks, id=name))
    # The worker's own costs on the scripted engine; its vLLM rows beside the engine's own ceiling.
    params[list(BENCHMARKS).index("worker_bench")] = pytest.param("worker_bench", ("memory",), id="worker_bench-memory")
    params.append(
        pytest.param(
            "worker_bench", ("fixed",), marks=[pytest.mark.slow, pytest.mark.real_engine], id="worker_bench-fixed"
        )
    )
    return params


def test_bench_every_benchmark_module_is_one_make_bench_runs_or_one_run_by_hand():
    modules = {path.stem for path in (REPO / "bench").glob("*_bench.py")}
    assert modules == set(EVERY) and not set(BENCHMARKS) & set(BY_HAND), "bench/__main__.py names each bench/*_bench.py"


@pytest.mark.parametrize(("name", "args"), smoke_params())
def test_bench_smoke_runs_and_saves_nothing(name: str, args: tuple[str, ...], tmp_path: Path):
    if name == "spot_bench" and not (SPOT_TRACES / "single-region.tar.gz").exists():
        pytest.skip(f"{SPOT_TRACES}: no published spot traces (set ORCH_SPOT_TRACES to their folder)")
    results = REPO / "bench" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.glob("*.json")} if results.exists() else {}
    done = subprocess.run(
        [str(EVERY[name]), "-m", f"bench.{name}", "--smoke", *args],
        cwd=REPO,
        env=env_with(TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=1200,  # a hang guard
    )
    assert done.returncode == 0, f"{name} --smoke:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    after = {p: p.stat().st_mtime_ns for p in results.glob("*.json")} if results.exists() else {}
    assert after == before, "a smoke run wrote bench/results"

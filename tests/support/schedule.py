"""The order the suites hand their tests to the xdist workers: the longest files first."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: The files whose tests run longest (a shared server's start-up, engine start-ups, kill storms: a
#: loaded CI run's durations, docs/testing.md), handed to the xdist workers first and in this order,
#: so that none of them is left to run alone at the end of the suite. Every other file follows in
#: collection order (`make test` runs pytest with --no-loadscope-reorder so this order is kept).
LONGEST_FIRST = [
    # the controller suite
    "test_skypilot_server.py",
    "test_serve.py",
    "test_faults.py",
    "test_bench_smoke.py",
    "test_docs_commands.py",
    "test_forecast.py",
    "test_cascade.py",
    "test_models.py",
    "test_web_page.py",
    "test_vllm_run_batch_inputs.py",
    "test_worker_processes.py",
    # the worker suite
    "worker/test_worker_kills.py",
    "worker/test_worker_signals.py",
    "worker/test_embeddings.py",
    "worker/test_worker_process.py",
    "worker/test_responses.py",
]


def longest_first(items: list[pytest.Item]) -> None:
    """Sort the collected items in place: LONGEST_FIRST's files in its order, then every other file in
    collection order; a file's tests stay together and in their order (a stable sort by file)."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(TESTS).as_posix(), len(rank)))

"""The worker's wait for an unreachable store: paced by the clock, never a negative pause."""

from __future__ import annotations

import time
import types

from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from worker import runner


def test_worker_wait_for_store_never_sleeps_a_negative_pause(tmp_path, monkeypatch):
    """The clock moves between any two reads: a wait whose end falls between two of them must
    not ask time.sleep for a negative pause (ValueError in the middle of a store outage)."""
    readings = iter([0.0, 0.01, 0.04, 0.06, 0.1, 0.2, 0.3])
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        time.sleep(seconds)  # the real one: it refuses a negative pause
        pauses.append(seconds)

    monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=lambda: next(readings), sleep=sleep))
    store = open_store(str(tmp_path / "store"))
    spec = load_spec(None, {"run": "r", "store": store.uri, "model.name": "m"}, env={}, default_file=False)
    worker = runner.Worker(store, spec, runner.WorkerIdentity.new("0", 0), engine_factory=lambda: None)  # type: ignore[arg-type,return-value]
    worker._wait_for_store()
    assert pauses and all(p >= 0 for p in pauses)

"""A worker's start-up as a run measured it: from its job's launch to its first flushed rows.

What a new machine costs before it answers (provisioning, the backend's runtime, the worker's
set-up, loading the model) is measured on the run itself where it has answered at all, instead of
the flat RESTART_OVERHEAD_S assumption: on a Slurm cluster with a ready environment it is about two
minutes, on a cloud VM that installs CUDA vLLM it can be ten or more.
"""

from __future__ import annotations

import statistics

from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_jobs
from orchestrator.core.store import Store


def measured_startup_s(store: Store, layout: RunLayout) -> float | None:
    """The median over workers of (first output part written - first job launched), or None when
    no worker has answered yet. Output parts are named `<worker>.<process>-<seq>`; one list of the
    outputs gives every worker's first one, by the store's clock."""
    record, _ = read_jobs(store, layout)
    launched = {
        worker: min(a.launched_at for a in jobs.attempts) for worker, jobs in record.workers.items() if jobs.attempts
    }
    first_part: dict[str, float] = {}
    for info in store.list(layout.outputs_root):
        worker = info.key.rsplit("/", 1)[-1].split(".", 1)[0]
        first_part[worker] = min(first_part.get(worker, info.modified), info.modified)
    samples = [first_part[w] - at for w, at in launched.items() if w in first_part and first_part[w] > at]
    return statistics.median(samples) if samples else None

"""Launching 16 SkyPilot workers with submission latency injected at the SDK boundary.

Side by side: one submission alone, orch's concurrent launch of 16, and a sequential loop of 16
(what a shell loop without `&` does; the SkyPilot example's `&` loop gets concurrency, but no job
ids, no error per worker and no record). Everything but the API server is real: template
rendering, SkyPilot's loader, sky.Task objects, the jobs record in a store.
Target: 16 workers in at most 2x the time of one submission.
"""

from __future__ import annotations

import os
import tempfile
import time

from bench.common import save, sized, table


def main() -> None:
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    os.environ["HOME"] = tempfile.mkdtemp(prefix="orch-bench-home-")  # importing sky writes ~/.sky
    import sky  # noqa: F401  (a one-time import cost, not a launch cost)

    from orchestrator.backends.skypilot import SkyPilotLauncher
    from orchestrator.core.context import RunContext
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.spec_load import load_spec
    from orchestrator.core.store import open_store
    from orchestrator.fleet.launch import launch_workers
    from tests.support.fake_sky import ScriptedSky
    from tests.support.runs import chat_request, make_run

    latency = sized(0.5, 0.2, 0.05)
    workers = 16

    def fresh_run() -> RunContext:
        store = open_store(tempfile.mkdtemp(prefix="orch-bench-store-"))
        make_run(store, "bench", [[chat_request(f"c{c}", "q")] for c in range(workers)], model="m", workers=workers)
        spec = load_spec(None, {"run": "bench", "store": "r2://b/p", "backend": "skypilot"}, env={}, default_file=False)
        return RunContext(spec, store, RunLayout("bench"))

    def timed(worker_ids: list[int], parallel: int) -> float:
        ctx = fresh_run()
        launcher = SkyPilotLauncher(ctx.spec, sdk=ScriptedSky(latency=latency), max_parallel=parallel)
        started = time.monotonic()
        for batch in [worker_ids] if parallel > 1 else [[w] for w in worker_ids]:
            launch_workers(ctx, launcher, batch)
        return time.monotonic() - started

    timed([0], 32)  # warm-up: the first render through SkyPilot's loader pays one-time costs
    one = timed([0], 32)
    concurrent = timed(list(range(workers)), 32)
    sequential = timed(list(range(workers)), 1)
    print(
        table(
            [
                ["1 submission", one, 1.0],
                [f"orch launch, {workers} workers", concurrent, concurrent / one],
                [f"sequential loop, {workers} workers", sequential, sequential / one],
            ],
            ["", "seconds", "x one submission"],
        )
    )
    save(
        "launch_bench",
        {
            "workers": workers,
            "injected_latency_s": latency,
            "one_s": round(one, 3),
            "concurrent_s": round(concurrent, 3),
            "sequential_s": round(sequential, 3),
            "concurrent_over_one": round(concurrent / one, 2),
            "target_concurrent_over_one": 2.0,
        },
    )


if __name__ == "__main__":
    main()

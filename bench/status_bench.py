"""`orch status` over a run of 10,000 chunks and 1,000 workers on a real S3 server (SeaweedFS).

The run is in mid-flight: 6,000 chunks done (marker + stats key each), 1,000 workers with a
heartbeat each, 1,000 jobs recorded. Side by side, on the same bucket:
  orch:  `gather` + `derive_status` + the table, as `orch status` runs them;
  naive: what a script without a protocol does: HEAD every chunk's done marker, GET every
         worker's heartbeat.
  page:  the run's web page over HTTP (`orch status --web`'s server, the code `orch serve` uses): the
         first view (it reads the status: gather's requests), then views while the run is watched
         (each answers from the last reading; a reading older than the interval is taken again in
         the background), and /metrics.
Requests are counted at the store (one per list page). Target: orch at most 30 requests; the page
answers in under 200 ms.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from bench.common import save, sized, table

if TYPE_CHECKING:
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.store import Store
    from orchestrator.planning.pricing import GpuTable
    from orchestrator.runview.status import RunStatus


def populate(store: Store, layout: RunLayout, chunks: int, workers: int, done: int) -> None:
    from orchestrator.core.frozen_spec import freeze_spec
    from orchestrator.core.layout import chunk_id
    from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
    from orchestrator.core.records import (
        DoneMarker,
        Heartbeat,
        JobAttempt,
        JobsRecord,
        ManifestEntry,
        PartRef,
        WorkerJobs,
        write_jsonl,
    )
    from orchestrator.core.spec_load import load_spec
    from orchestrator.planning.plan import plan_chunks, write_plan

    spec = load_spec(None, {"run": layout.run, "store": store.uri, "model.name": "m"}, env={}, default_file=False)
    freeze_spec(store, layout, spec)
    entries = [
        ManifestEntry(
            chunk=chunk_id(i, chunks),
            key=layout.chunk_path(chunk_id(i, chunks)),
            rows=100,
            bytes=30_000,
            est_prompt_tokens=6_000,
            max_output_tokens=25_600,
        )
        for i in range(chunks)
    ]
    store.put(layout.manifest, write_jsonl(entries))
    plan = plan_chunks(entries, workers)
    write_plan(store, layout, plan)
    now = time.time()
    jobs = JobsRecord(
        backend="skypilot",
        workers={
            str(w): WorkerJobs(
                worker=w, attempts=[JobAttempt(job_id=str(100 + w), backend="skypilot", launched_at=now - 3600)]
            )
            for w in range(workers)
        },
    )
    store.put(layout.jobs, jobs.to_bytes())

    def finish(i: int) -> None:
        cid = entries[i].chunk
        worker = str(i % workers)
        marker = DoneMarker(
            chunk=cid,
            parts=[PartRef(key=layout.output_part(cid, f"{worker}.x", 1), rows=100, errors=0, bytes=1, sha256="0")],
            rows=100,
            errors=0,
            worker=worker,
            holder=f"{worker}.x",
            accelerator="NVIDIA L4",
            model="m",
            spec_hash="h",
            started_at=now - 600,
            finished_at=now - 60 + i * 1e-3,
            tokens_in=6_000,
            tokens_out=25_600,
        )
        store.put_if_absent(layout.done(cid), marker.to_bytes())
        store.put(layout.stats(cid, marker.stats().key_values(), marker.finished_at), b"")

    def beat(w: int) -> None:
        HeartbeatPublisher(
            store,
            layout,
            Heartbeat(
                worker=str(w),
                holder=f"{w}.x",
                state="running",
                accelerator="NVIDIA L4",
                spot=True,
                host="h",
                pid=1,
                started_at=now - 3600,
                updated_at=now,
                chunk=entries[-1 - w].chunk,
                chunk_rows=100,
                chunk_rows_done=40,
            ),
        ).publish()

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(finish, range(done)))
        list(pool.map(beat, range(workers)))


def page_views(store: Store, layout: RunLayout, prices: GpuTable, chunks: int, done: int) -> dict[str, Any]:
    """The page over HTTP while watched: a view every 0.25 s for 10 s, the status read again in the
    background whenever the last reading is over 2 s old (what `orch status --web --interval 2` does)."""
    import statistics
    import threading
    import urllib.request

    from orchestrator.core.context import RunContext
    from orchestrator.core.spec import RunSpec
    from orchestrator.runview.status import derive_status, gather
    from orchestrator.web.local import page_server
    from orchestrator.web.snapshots import Snapshots

    readings: list[int] = []

    def read(_run: str) -> RunStatus:
        before = sum(store.requests.by_op.values())
        status = derive_status(gather(store, layout, None), now=time.time(), prices=prices)
        readings.append(sum(store.requests.by_op.values()) - before)
        return status

    ctx = RunContext(RunSpec(run=layout.run), store, layout)
    server = page_server(Snapshots(read, max_age=2.0), ctx, 0, 2.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def view(path: str) -> tuple[float, str]:
        started = time.monotonic()
        with urllib.request.urlopen(base + path, timeout=60) as r:
            body = r.read().decode()
        return time.monotonic() - started, body

    try:
        store.requests.reset()
        first_s, body = view(f"/runs/{layout.run}")
        first_requests = sum(store.requests.by_op.values())
        assert f">{done}/{chunks}<" in body, "the page does not show the chunks done"
        store.requests.reset()
        times: list[float] = []
        metrics_times: list[float] = []
        cpu = time.process_time()
        ends = time.monotonic() + 10
        while time.monotonic() < ends:
            times.append(view(f"/runs/{layout.run}")[0])
            metrics_times.append(view("/metrics")[0])
            time.sleep(0.25)
        cpu = time.process_time() - cpu
        views, background = len(times), readings[1:]
        during = sum(store.requests.by_op.values())
    finally:
        server.shutdown()
    return {
        "first_s": round(first_s, 3),
        "first_requests": first_requests,
        "views": views,
        "median_s": round(statistics.median(times), 4),
        "max_s": round(max(times), 4),
        "metrics_median_s": round(statistics.median(metrics_times), 4),
        "readings": len(background),
        "requests_per_reading": max(background or [first_requests]),
        "requests_during_views": during,
        "requests_per_view": round(during / (2 * views), 1),
        "html_bytes": len(body),
        # This process's CPU per view and scrape (server and client both; background readings included).
        "cpu_per_view_and_scrape_s": round(cpu / views, 4),
    }


def main() -> None:
    from orchestrator.commands.console import to_text
    from orchestrator.commands.views import status_view
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.records import read_manifest
    from orchestrator.core.store import open_store
    from orchestrator.planning.pricing import load_gpu_table
    from orchestrator.runview.status import derive_status, gather
    from tests.support.s3servers import seaweedfs

    chunks, workers, done = sized((10_000, 1_000, 6_000), (2_000, 200, 1_200), (100, 10, 60))
    with seaweedfs() as server:
        os.environ.update(server.env())
        store = open_store(server.store_uri(server.new_bucket(), "runs"))
        layout = RunLayout("bench")
        started = time.monotonic()
        populate(store, layout, chunks, workers, done)
        print(
            f"SeaweedFS: {chunks:,} chunks ({done:,} done), {workers:,} workers written in "
            f"{time.monotonic() - started:.0f} s"
        )
        prices = load_gpu_table()

        store.requests.reset()
        started = time.monotonic()
        status = derive_status(gather(store, layout, None), now=time.time(), prices=prices)
        to_text(status_view(status))
        orch_s, orch_requests = time.monotonic() - started, dict(store.requests.by_op)
        assert status.chunks.model_dump() == {"total": chunks, "done": done}, status.chunks
        assert len(status.workers) == workers

        manifest = [e.chunk for e in read_manifest(store, layout)]
        heartbeat_keys = [i.key for i in store.list(layout.heartbeats_prefix)]
        store.requests.reset()
        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            naive_done = sum(r is not None for r in pool.map(lambda c: store.head(layout.done(c)), manifest))
            list(pool.map(lambda k: store.get(k), heartbeat_keys))
        naive_s, naive_requests = time.monotonic() - started, dict(store.requests.by_op)
        assert naive_done == done

        page = page_views(store, layout, prices, chunks, done)

    n_orch, n_naive = sum(orch_requests.values()), sum(naive_requests.values())
    print(
        table(
            [
                ["orch status", n_orch, orch_s, 1.0],
                ["naive (HEAD per chunk, GET per heartbeat; 32 threads)", n_naive, naive_s, naive_s / orch_s],
                [
                    "page, first view (reads the status)",
                    page["first_requests"],
                    page["first_s"],
                    page["first_s"] / orch_s,
                ],
                [
                    f"page, median of {page['views']} views while watched",
                    page["requests_per_view"],
                    page["median_s"],
                    page["median_s"] / orch_s,
                ],
                ["page, slowest of those views", page["requests_per_view"], page["max_s"], page["max_s"] / orch_s],
                [
                    "/metrics, median scrape",
                    page["requests_per_view"],
                    page["metrics_median_s"],
                    page["metrics_median_s"] / orch_s,
                ],
            ],
            ["", "requests", "seconds", "x orch time"],
        )
    )
    print(
        f"page: {page['views']} views and as many scrapes in 10 s made {page['requests_during_views']} store requests "
        f"({page['readings']} background readings of at most {page['requests_per_reading']} requests); "
        f"CPU per view and scrape, readings included: {page['cpu_per_view_and_scrape_s']} s"
    )
    print(f"orch requests by operation: {orch_requests} (target: at most 30)")
    save(
        "status_bench",
        {
            "chunks": chunks,
            "done": done,
            "workers": workers,
            "store": "SeaweedFS (S3 API, 127.0.0.1)",
            "orch": {"requests": n_orch, "by_op": orch_requests, "seconds": round(orch_s, 3)},
            "naive": {"requests": n_naive, "by_op": naive_requests, "seconds": round(naive_s, 3)},
            "page": page,
            "target_requests": 30,
            "target_page_s": 0.2,
        },
    )


if __name__ == "__main__":
    main()

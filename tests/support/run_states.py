"""Runs in a state a status, collect or deadline test starts from, written straight into a store, and
what the CLI says of a run (in this process)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import acquire
from orchestrator.core.records import Heartbeat, JobAttempt, read_manifest, update_jobs
from orchestrator.core.store import Store, open_store
from orchestrator.planning.plan import plan_chunks, write_plan
from tests.support.runs import Answer, answer_chunk, chat_request, make_run


def collect_json(store: str, run: str, out: Path, capsys: Any) -> dict[str, Any]:
    """`orch collect --json` of the run into `out`; what it says, as a dict."""
    capsys.readouterr()
    assert main(["collect", "--run", run, "--store", store, "--out", str(out), "--json"]) == 0
    said: dict[str, Any] = json.loads(capsys.readouterr().out)
    return said


def reused_rows(store: str, run: str) -> int:
    """How many rows the run's prepare reused from earlier runs (its prepare record says)."""
    record = json.loads(open_store(store).get(RunLayout(run).prepare_record).data)
    return int(record["reused"])


def two_hours_on_an_a100(worker: str, now: float, **more: str) -> Heartbeat:
    """A running worker's heartbeat: up two hours on a spot A100-80GB on GCP."""
    return Heartbeat(
        worker=worker,
        holder=f"{worker}.live",
        state="running",
        started_at=now - 7200,
        updated_at=now,
        accelerator="NVIDIA A100-SXM4-80GB",
        spot=True,
        cloud="gcp",
        **more,
    )


def run_under_way(store_uri: str) -> tuple[Store, RunLayout]:
    """Run "s", four chunks of ten rows on two SkyPilot workers: chunk 0 answered (an error row
    among them) by worker 1 in an hour, chunk 1 four rows in under worker 0's live lease (up two
    hours on a spot A100), both workers' jobs recorded."""
    store = open_store(store_uri)
    layout = make_run(store, "s", [[chat_request(f"c{c}-{i}", "q") for i in range(10)] for c in range(4)], model="m")
    write_plan(store, layout, plan_chunks(read_manifest(store, layout), 2))
    answer_chunk(
        store,
        layout,
        "part_00000",
        [[Answer(i, f"c0-{i}", "x") for i in range(9)] + [Answer(9, "c0-9", error="e")]],
        worker="1",
        seconds=3600,
    )
    acquire(store, layout, "part_00001", worker="0", holder="0.live", ttl=600, now=time.time())
    now = time.time()
    HeartbeatPublisher(store, layout, two_hours_on_an_a100("0", now, region="us-central1")).publish(
        chunk="part_00001",
        chunk_rows=10,
        chunk_rows_done=4,
        rows_saved=1,
        rows_unsaved=3,
        rows_per_s=0.5,
        tokens_per_s=120.0,
        updated_at=now,
    )
    update_jobs(
        store,
        layout,
        lambda rec: [
            rec.worker(w).attempts.append(JobAttempt(job_id=str(11 + w), backend="skypilot", launched_at=now))
            for w in (0, 1)
        ],
    )
    return store, layout


def running_beat(ctx: Any, worker: int, rows_per_s: float, *, up_h: float = 1.0) -> None:
    """Worker `worker`'s heartbeat, up `up_h` hours on a spot L4, between chunks at `rows_per_s`."""
    now = time.time()
    HeartbeatPublisher(
        ctx.store,
        ctx.layout,
        Heartbeat(
            worker=str(worker),
            holder=f"{worker}.h",
            state="running",
            accelerator="NVIDIA L4",
            spot=True,
            started_at=now - up_h * 3600,
            updated_at=now,
            chunk=None,
            rows_per_s=rows_per_s,
        ),
    ).publish()

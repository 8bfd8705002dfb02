"""The worker, as a real process where a test needs one (kill -9, signals, races, replicas, the CLI), else in this
process on the session's engine: exactly-once outputs, takeovers, parquet parts, the engine kept busy."""

from __future__ import annotations

import io
import itertools
import os
import re
import threading
import time
from pathlib import Path

import pytest

from orchestrator.core.exits import WorkerStatus
from orchestrator.core.layout import RunLayout, chunk_id
from orchestrator.core.protocol.leases import acquire, read_lease
from orchestrator.core.protocol.parts import iter_part_lines, part_codec
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import open_store
from tests.support.runs import Answer, chat_request, make_run
from tests.support.worker_process import (
    WorkerProcess,
    answered,
    chunk_of,
    run_in_process,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def exit_code(summary: dict) -> int:
    """The exit code `python -m worker` leaves for this summary's status."""
    return WorkerStatus(summary["status"]).exit_code


def test_worker_answers_every_row_exactly_once(store_uri, tiny_engine, tiny_model):
    store = open_store(store_uri)
    chunks = [chunk_of(f"c{c}", 15) for c in range(3)]
    chunks[1].append(b"{this line is not json")
    layout = make_run(store, "once", chunks, model=tiny_model, workers=2)
    summary = run_in_process(store, "once", tiny_engine)
    assert exit_code(summary) == 0
    assert summary["status"] == "SUCCESS" and summary["requests"] == 46 and summary["errors"] == 1
    assert summary["chunks_done"] == 3  # its own list, then worker 1's chunk: nobody else came
    seen = answered(store, layout)
    assert seen.pop(None) == 1  # the line that is not JSON has no custom_id: an error row all the same
    assert len(seen) == 45 and set(seen.values()) == {1}
    assert len(list(store.list(layout.done_prefix))) == 3


def test_worker_takes_over_an_expired_lease_and_reuses_its_parts(store_uri, tiny_engine, tiny_model):
    store = open_store(store_uri)
    ttl = 2.0
    layout = make_run(
        store,
        "expired",
        [chunk_of("e", 10), chunk_of("x", 10)],
        model=tiny_model,
        lists=[[0], [1]],
        spec_flags={"workers.lease_ttl": ttl, "workers.heartbeat_interval": 0.5},
    )
    # Worker 1 died holding chunk 1 after flushing its first three rows. Its lease expires a TTL
    # after it was written, by the store's clock too (a lease the store saw written lately is a
    # live holder's, whatever the times inside it say): the test waits that out.
    acquire(store, layout, "part_00001", worker="1", holder="1.dead", ttl=ttl, now=time.time())
    while time.time() - store.head(layout.lease("part_00001")).modified <= ttl + 1:  # S3 stamps whole seconds
        time.sleep(0.1)
    dead_rows = [Answer(i, f"x-{i}", "flushed before the worker died") for i in range(3)]
    store.put(layout.output_part("part_00001", "1.dead", 1), part_codec("jsonl", "part_00001").encode(dead_rows))
    summary = run_in_process(store, "expired", tiny_engine)
    assert exit_code(summary) == 0 and summary["chunks_done"] == 2
    assert summary["requests"] == 10 + 7  # the dead worker's three flushed rows were kept
    marker = DoneMarker.model_validate_json(store.get(layout.done("part_00001")).data)
    assert marker.holder.startswith("0.") and len(marker.parts) == 2


def test_worker_writes_parquet_parts_when_asked(tiny_engine, tiny_model, tmp_path):
    store = open_store(str(tmp_path / "store"))
    layout = make_run(
        store, "pq", [chunk_of("p", 12)], model=tiny_model, spec_flags={"workers.output_format": "parquet"}
    )
    summary = run_in_process(store, "pq", tiny_engine)
    assert exit_code(summary) == 0
    marker = DoneMarker.model_validate_json(store.get(layout.done("part_00000")).data)
    assert marker.output_format == "parquet" and marker.parts[0].key.endswith(".parquet")
    assert sum(answered(store, layout).values()) == 12


def test_worker_ignores_unknown_fields_under_warn_and_counts_them(tiny_engine, tiny_model, tmp_path):
    """`requests.unknown_fields: warn`: vLLM's way, the rows answered and the summary counting each field."""
    store = open_store(str(tmp_path / "store"))
    rows = [chat_request(f"u{i}", "Hello", max_tokens=4, temprature=0.3, **({"foo": 1} if i else {})) for i in range(3)]
    layout = make_run(store, "warn", [rows], model=tiny_model, spec_flags={"requests.unknown_fields": "warn"})
    summary = run_in_process(store, "warn", tiny_engine)
    assert exit_code(summary) == 0 and summary["errors"] == 0
    assert summary["ignored_fields"] == {"foo": 2, "temprature": 3}
    assert sum(answered(store, layout).values()) == 3


def test_worker_with_a_model_it_cannot_load_says_why_and_frees_the_chunk(tmp_path):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "bad", [chunk_of("b", 3)], model=str(tmp_path / "no-such-model"))
    worker = WorkerProcess(store_uri, "bad", "0", tmp_path)
    code, _ = worker.finish()
    assert code != 0
    assert "ERROR" in worker.stderr and "no-such-model" in worker.stderr
    assert "Traceback" not in worker.stderr
    assert read_lease(store, layout, "part_00000")[0].released


def test_worker_replicas_claim_chunks_independently(tiny_model, tmp_path):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(store, "dp", [chunk_of(f"d{c}", 40, max_tokens=32) for c in range(4)], model=tiny_model)
    env_args = ("--replicas", "2")
    code, summary = WorkerProcess(store_uri, "dp", "0", tmp_path, *env_args).finish()
    assert code == 0 and summary["replicas"] == 2 and summary["chunks_done"] == 4
    holders = {DoneMarker.model_validate_json(store.get(o.key).data).worker for o in store.list(layout.done_prefix)}
    assert holders <= {"0r0", "0r1"}
    assert len(answered(store, layout)) == 160


def test_worker_with_smollm2_gives_real_answers(smollm2_model, tmp_path):
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    layout = make_run(
        store,
        "real",
        [[chat_request("france", "What is the capital of France?", max_tokens=24, temperature=0)]],
        model=smollm2_model,
    )
    code, _ = WorkerProcess(store_uri, "real", "0", tmp_path).finish()
    assert code == 0
    marker = DoneMarker.model_validate_json(store.get(layout.done("part_00000")).data)
    line = next(iter_part_lines(store.get(marker.parts[0].key).data, "jsonl"))
    assert "Paris" in (line.text() or "")
    assert os.path.basename(smollm2_model) in marker.model


def test_worker_flushes_when_its_buffer_is_full_whatever_the_interval(tiny_engine, tiny_model, tmp_path, monkeypatch):
    """A fast engine must not hold a whole chunk in memory until the next checkpoint."""
    from orchestrator.core.spec_load import load_spec
    from worker import runner

    monkeypatch.setattr(runner, "MAX_BUFFERED_ROWS", 8)
    store = open_store(str(tmp_path / "store"))
    # One row finishes per engine step: row i asks for i + 1 tokens.
    rows = [chat_request(f"b-{i}", f"Item {i}", max_tokens=i + 1, ignore_eos=True) for i in range(30)]
    layout = make_run(store, "buffer", [rows], model=tiny_model)
    spec = load_spec(
        None,
        {"run": "buffer", "store": store.uri, "model.name": tiny_model, "workers.checkpoint_interval": 3600},
        env={},
        default_file=False,
    )
    summary = runner.Worker(store, spec, runner.WorkerIdentity.new("0", 0), lambda: tiny_engine).run()
    assert summary["requests"] == 30
    marker = DoneMarker.model_validate_json(store.get(layout.done(chunk_id(0, 1))).data)
    assert [p.rows for p in marker.parts] == [8, 8, 8, 6]
    assert sum(answered(store, layout).values()) == 30


def test_worker_feeds_the_next_chunk_before_the_current_one_drains(tiny_engine, tiny_model, tmp_path):
    """One engine run over all chunks: the next chunk's requests join while the last rows of the
    current one generate, so the batch never empties between chunks; but never more than two
    chunks are in hand, so a worker does not sit on leases it is not about to work on."""
    from orchestrator.core.spec_load import load_spec
    from worker import runner

    store = open_store(str(tmp_path / "store"))
    # Chunk c's longest answer is 24 * (c + 1) tokens: each chunk outlasts the one before it.
    chunks = [
        [chat_request(f"p{c}-{i}", f"Item {i}", max_tokens=2 * (i + 1) * (c + 1), ignore_eos=True) for i in range(12)]
        for c in range(4)
    ]
    layout = make_run(store, "pipe", chunks, model=tiny_model)
    spec = load_spec(None, {"run": "pipe", "store": store.uri, "model.name": tiny_model}, env={}, default_file=False)
    summary = runner.Worker(store, spec, runner.WorkerIdentity.new("0", 0), lambda: tiny_engine).run()
    assert summary["requests"] == 48 and summary["chunks_done"] == 4
    markers = [DoneMarker.model_validate_json(store.get(layout.done(chunk_id(c, 4))).data) for c in range(4)]
    for earlier, later in itertools.pairwise(markers):
        assert later.started_at < earlier.finished_at  # taken (and fed) before the earlier one finished
    for first, third in zip(markers, markers[2:], strict=False):
        assert third.started_at >= first.finished_at  # ...but only one chunk ahead
    seen = answered(store, layout)
    assert len(seen) == 48 and set(seen.values()) == {1}


def test_worker_progress_lines_give_the_pace_while_the_engine_works(tiny_engine, tiny_model, tmp_path):
    """Progress lines in a log (not a terminal) give tokens/s while the engine works, not 0.0 until
    it drains: the pace the summary line ends with (tokens out over the engine's busy time)."""
    from orchestrator.core.spec_load import load_spec
    from worker import runner
    from worker.progress import ProgressReporter

    store = open_store(str(tmp_path / "store"))
    rows = [chat_request(f"g-{i}", f"Item {i}", max_tokens=8 + 2 * i, ignore_eos=True) for i in range(24)]
    make_run(store, "pace", [rows], model=tiny_model)
    spec = load_spec(None, {"run": "pace", "store": store.uri, "model.name": tiny_model}, env={}, default_file=False)
    lines = io.StringIO()
    progress = ProgressReporter(lines, every_s=0, interactive=False)
    summary = runner.Worker(
        store, spec, runner.WorkerIdentity.new("0", 0), lambda: tiny_engine, progress=progress
    ).run()
    rates = [float(r) for r in re.findall(r"rows \(\d+%\), ([\d.]+) tok/s", lines.getvalue())]
    assert len(rates) >= 3 and all(r > 0 for r in rates), lines.getvalue()
    # Not below the summary's pace: a rate held back until the engine drains would be. (It may be
    # above it: the summary's busy time also counts the chunk's end after the last row, seconds
    # when the machine is loaded.)
    assert rates[-1] > 0.5 * summary["tokens_out"] / summary["busy_s"], (rates, summary)


class HeartbeatsHang:
    """A real store whose heartbeat PUTs from the worker's background thread hang until released:
    a store far away, or one that stalls, as seen by the thread that publishes heartbeats."""

    def __init__(self, store, heartbeats_prefix: str):
        self.store, self.prefix = store, heartbeats_prefix
        self.release, self.hanging = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def put(self, key: str, data: bytes) -> str:
        if key.startswith(self.prefix) and threading.current_thread().name == "lease-and-heartbeat":
            self.hanging.set()
            self.release.wait(timeout=600)  # the test releases it when it ends
        return self.store.put(key, data)


def test_the_engine_loop_never_waits_on_a_heartbeat_put(tiny_engine, tiny_model, tmp_path):
    """While the heartbeat thread waits on the store, the engine keeps answering rows and the
    worker keeps flushing them: a slow store costs heartbeats, never GPU time. (The heartbeat once
    held the lock the engine loop counts rows under, so a store 0.3 s away stalled the loop for
    most of each beat.)"""
    from orchestrator.core.spec_load import load_spec
    from worker import runner

    store = HeartbeatsHang(open_store(str(tmp_path / "store")), RunLayout("hang").heartbeats_prefix)
    chunks = [chunk_of(f"h{c}", 16, max_tokens=48) for c in range(3)]
    layout = make_run(store.store, "hang", chunks, model=tiny_model)
    settings = {"workers.heartbeat_interval": 0.2, "workers.checkpoint_interval": 0.2}
    spec = load_spec(
        None, {"run": "hang", "store": store.uri, "model.name": tiny_model, **settings}, env={}, default_file=False
    )
    worker = runner.Worker(store, spec, runner.WorkerIdentity.new("0", 0), lambda: tiny_engine)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(worker.run()), daemon=True)
    thread.start()
    try:
        assert store.hanging.wait(timeout=120), "the worker published no heartbeat in the background"
        deadline = time.monotonic() + 300  # a hang guard for a few seconds' work
        while len(list(store.list(layout.done_prefix))) < 3:  # every chunk finished, the PUT still hanging
            assert time.monotonic() < deadline, "the engine loop stalled behind the heartbeat's PUT"
            time.sleep(0.1)
    finally:
        store.release.set()
        thread.join(timeout=60)
    assert result["requests"] == 48 and result["chunks_done"] == 3
    seen = answered(store.store, layout)
    assert len(seen) == 48 and set(seen.values()) == {1}


class DrainTakesLong:
    """The real engine; each time it has finished its rows, `passed()` is called: time has gone by."""

    def __init__(self, engine, passed):
        self.engine, self.passed = engine, passed

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, requests):
        yield from self.engine.run(requests)
        self.passed()


def test_worker_looks_for_work_again_after_its_last_rows_drain(tiny_engine, tiny_model, tmp_path):
    """A lease that expires while the worker's last chunk drains is taken over before it exits.

    The drain "takes" 100 s by making the dead holder's last renewal 100 s old, by its own clock
    (`expires_at`) and by the store's (the lease file's time): leases are judged on both
    (core/protocol/clocks.py). Moving the worker's clock alone raced its heartbeat: the worker
    measures its offset from the store's clock, and once it had measured the jump as skew, the
    lease was still young by the store's clock and the worker exited with one chunk."""
    from orchestrator.core.spec_load import load_spec
    from worker import runner

    store = open_store(str(tmp_path / "store"))
    layout = make_run(store, "drain", [chunk_of("a", 6), chunk_of("b", 6)], model=tiny_model, lists=[[0], [1]])
    acquire(store, layout, "part_00001", worker="1", holder="1.dead", ttl=60, now=time.time())  # dies holding it

    def dead_holder_renewed_100_s_ago() -> None:
        found = read_lease(store, layout, "part_00001")
        if found is None or found[0].holder != "1.dead":
            return
        then = time.time() - 100
        lease = found[0].model_copy(update={"renewed_at": then, "expires_at": then + 60})
        store.put(layout.lease("part_00001"), lease.to_bytes())
        os.utime(tmp_path / "store" / layout.lease("part_00001"), (then, then))

    spec = load_spec(
        None,
        {"run": "drain", "store": store.uri, "model.name": tiny_model, "workers.lease_ttl": 60},
        env={},
        default_file=False,
    )
    worker = runner.Worker(
        store,
        spec,
        runner.WorkerIdentity.new("0", 0),
        lambda: DrainTakesLong(tiny_engine, dead_holder_renewed_100_s_ago),
    )
    summary = worker.run()
    assert summary["chunks_done"] == 2
    assert DoneMarker.model_validate_json(store.get(layout.done("part_00001")).data).holder.startswith("0.")


def test_worker_loads_a_bucket_model_from_the_mount_the_task_gave_it(tiny_model, tmp_path, monkeypatch):
    """A run whose model is `s3://...` keeps that name (and its spec hash); the SkyPilot task mounts
    the bucket and says where (ORCH_MODEL_PATH), and the engine loads the weights from there."""
    from orchestrator.core.spec_load import load_spec
    from worker.__main__ import _load_engine

    flags = {"run": "b", "store": str(tmp_path), "model.name": "s3://weights/tiny", "model.engine": "transformers"}
    spec = load_spec(None, flags, env={}, default_file=False)
    monkeypatch.setenv("ORCH_MODEL_PATH", tiny_model)
    engine = _load_engine(open_store(str(tmp_path)), spec)
    try:
        # Loaded from the mount (the bucket itself is not reachable), answering under the run's name.
        assert spec.model.name == "s3://weights/tiny" and engine.model_name == "s3://weights/tiny"
    finally:
        engine.close()

"""The worker's loop: claim a chunk, resume it, keep the engine saturated, checkpoint, mark it done; repeat.

One `Worker` is one process with one engine. Per chunk:
1. Take the lease (ChunkClaimer); skip the chunk if its marker appeared meanwhile.
2. Resume: rows already in checkpointed parts are not run again.
3. Stream the chunk's request lines into the engine, which pulls them as it has room; bad lines
   become error rows without reaching the engine.
4. Every `checkpoint_interval` seconds (or MAX_BUFFERED_ROWS rows) flush finished rows as a part
   (renewing the lease first);
   on SIGTERM/SIGINT flush what is finished, give the lease back and stop.
5. When every row is flushed, write the done marker (create-if-absent).
A background thread renews the lease and publishes the heartbeat; if the lease is lost, the loop
drops the chunk at the next engine step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from orchestrator.protocol.checkpoints import ChunkJob
from orchestrator.protocol.claims import ChunkClaimer, PlanIndex, RunView
from orchestrator.protocol.heartbeats import HeartbeatPublisher
from orchestrator.protocol.layout import RunLayout
from orchestrator.protocol.leases import HeldLease, LeaseKeeper, LeaseLost
from orchestrator.protocol.records import Heartbeat, ManifestEntry, PlanRecord, parse_record, read_jsonl
from orchestrator.spec import RunSpec, spec_hash
from orchestrator.store import NotFound, Store
from orchestrator.protocol.parts import part_codec
from worker.engine.base import Engine, RowResult
from worker.progress import ProgressReporter
from worker.requests import EngineRequest, parse_request

log = logging.getLogger("orch.worker")

#: Finished rows held between checkpoints, at most: bounds the worker's memory when the engine
#: outruns the checkpoint interval (a fast GPU, short answers), whatever the chunk's size.
MAX_BUFFERED_ROWS = 4096


class Shutdown(Exception):
    """SIGTERM/SIGINT arrived: finished rows were flushed and the lease given back."""


@dataclass
class WorkerIdentity:
    worker: str
    own: int | None
    holder: str
    accelerator: str | None = None
    spot: bool | None = None
    cloud: str | None = None
    region: str | None = None

    @staticmethod
    def new(worker: str, own: int | None, **kw: Any) -> "WorkerIdentity":
        return WorkerIdentity(worker=worker, own=own, holder=f"{worker}.{uuid.uuid4().hex[:10]}", **kw)


@dataclass
class Totals:
    """What this process did: the numbers of the JSON summary line and the heartbeat."""

    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    chunks_done: int = 0
    chunks_lost: int = 0
    busy_s: float = 0.0
    started_at: float = field(default_factory=time.time)
    # The chunk in hand.
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0

    def add(self, rows: list[RowResult]) -> None:
        self.requests += len(rows)
        self.errors += sum(r.error for r in rows)
        self.tokens_in += sum(r.tokens_in for r in rows)
        self.tokens_out += sum(r.tokens_out for r in rows)
        self.chunk_rows_done += len(rows)

    def rows_per_s(self) -> float | None:
        return self.requests / self.busy_s if self.busy_s > 1 and self.requests else None

    def tokens_per_s(self) -> float:
        return (self.tokens_out / self.busy_s) if self.busy_s > 0 else 0.0

    def summary(self, wall_s: float, status: str) -> dict[str, Any]:
        return {
            "status": status,
            "requests": self.requests,
            "errors": self.errors,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_per_s": round(self.tokens_out / wall_s, 2) if wall_s > 0 else 0.0,
            "chunks_done": self.chunks_done,
            "chunks_lost": self.chunks_lost,
            "wall_s": round(wall_s, 3),
        }


class Worker:
    def __init__(
        self,
        store: Store,
        spec: RunSpec,
        identity: WorkerIdentity,
        engine_factory: Callable[[], Engine],
        *,
        clock: Callable[[], float] = time.time,
        max_chunks: int | None = None,
        progress: ProgressReporter | None = None,
    ):
        self.store = store
        self.spec = spec
        self.layout: RunLayout = spec.layout
        self.identity = identity
        self.engine_factory = engine_factory
        self.clock = clock
        self.max_chunks = max_chunks
        self.settings = spec.workers
        self.spec_hash = spec_hash(spec)
        self.totals = Totals(started_at=clock())
        self.progress = progress or ProgressReporter(stream=sys.stderr)
        self._engine: Engine | None = None
        self._keeper: LeaseKeeper | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._publisher = HeartbeatPublisher(
            store,
            self.layout,
            Heartbeat(
                worker=identity.worker, holder=identity.holder, state="starting",
                accelerator=identity.accelerator, spot=identity.spot, cloud=identity.cloud,
                region=identity.region, host=socket.gethostname(), pid=os.getpid(),
                started_at=self.totals.started_at, updated_at=self.totals.started_at,
            ),
        )  # fmt: skip

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Work until no chunk is left for us. Returns the summary; raises Shutdown on SIGTERM."""
        started = self.clock()
        manifest = self._manifest()
        rows = {e.chunk: e for e in manifest}
        index = PlanIndex.build(self._plan(), {e.chunk: float(e.est_tokens) for e in manifest})
        claimer = ChunkClaimer(
            store=self.store, layout=self.layout, view=RunView(self.store, self.layout, index),
            worker=self.identity.worker, holder=self.identity.holder, ttl=self.settings.lease_ttl,
            clock=self.clock, own=self.identity.own, rows_per_s=self.totals.rows_per_s,
        )  # fmt: skip
        beat = threading.Thread(target=self._background, name="lease-and-heartbeat", daemon=True)
        beat.start()
        status = "SUCCESS"
        try:
            while not self._stop.is_set():
                if self.max_chunks is not None and self.totals.chunks_done >= self.max_chunks:
                    break
                held = claimer.next_chunk()
                if held is None:
                    break
                self._work_on(held, rows[held.chunk])
        except Shutdown:
            status = "INTERRUPTED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self._stop.set()
            beat.join(timeout=5)
            exit_code = {"SUCCESS": 0, "INTERRUPTED": 143}.get(status, 1)
            with contextlib.suppress(Exception):
                self._publish(state="exited", chunk=None, exit_code=exit_code)
            if self._engine is not None:
                self._engine.close()
            self.progress.close()
        return self.totals.summary(self.clock() - started, status)

    def request_stop(self) -> None:
        """Called from the signal handler: the loop flushes and stops at the next engine step."""
        self._shutdown_requested = True

    _shutdown_requested = False

    def _work_on(self, held: HeldLease, entry: ManifestEntry) -> None:
        keeper = LeaseKeeper(self.store, self.layout, held, ttl=self.settings.lease_ttl, clock=self.clock)
        if self.store.head(self.layout.done(entry.chunk)) is not None:
            self.store.delete(self.layout.lease(entry.chunk))  # finished by someone else meanwhile
            return
        with self._lock:
            self._keeper = keeper  # renewed in the background from here on, model loading included
        try:
            engine = self._engine_loaded()
            job = ChunkJob(self.store, self.layout, keeper, part_codec(self.settings.output_format, entry.chunk),
                           self.clock, chunk_rows=entry.rows)  # fmt: skip
            point = job.resume()
            with self._lock:
                self.totals.chunk, self.totals.chunk_rows = entry.chunk, entry.rows
                self.totals.chunk_rows_done = len(point.done_rows)
            self._publish(state="running")
            self.progress.start_chunk(entry.chunk, entry.rows, len(point.done_rows))
            self._run_chunk(engine, job, entry, point.done_rows)
        except LeaseLost as lost:
            if self._engine is not None:
                self._engine.abort()
            self.totals.chunks_lost += 1
            log.warning("worker %s: %s; dropping the chunk", self.identity.worker, lost)
            self.progress.note(f"{entry.chunk}: lease lost to {lost.by or 'another worker'}; chunk dropped")
        except Shutdown:
            raise  # the lease was given back already, after the last flush
        except BaseException:
            # Whatever failed (the engine, the store), the chunk is free for others at once.
            with contextlib.suppress(Exception):
                keeper.release()
            raise
        finally:
            with self._lock:
                self._keeper = None
                self.totals.chunk = None

    def _run_chunk(self, engine: Engine, job: ChunkJob, entry: ManifestEntry, skip: set[int]) -> None:
        """Steps 3-5 of the module docstring."""
        side_errors: list[RowResult] = []
        buffer: list[RowResult] = []
        last_flush = self.clock()
        busy_from = time.monotonic()
        try:
            with contextlib.closing(engine.run(self._requests(entry, skip, side_errors))) as steps:
                for finished in steps:
                    self._take(buffer, finished + side_errors)
                    side_errors.clear()
                    if job.keeper.lost is not None:
                        raise job.keeper.lost
                    if self._shutdown_requested:
                        engine.abort()
                        self._flush(job, buffer)
                        job.keeper.release()
                        raise Shutdown()
                    if (self.clock() - last_flush >= self.settings.checkpoint_interval
                            or len(buffer) >= MAX_BUFFERED_ROWS):  # fmt: skip
                        self._flush(job, buffer)
                        buffer.clear()
                        last_flush = self.clock()
            self._take(buffer, side_errors)  # bad lines after the last request the engine took
            self._flush(job, buffer)
        finally:
            self.totals.busy_s += time.monotonic() - busy_from
        marker = job.complete(
            worker=self.identity.worker, model=self.spec.model.name or "", spec_hash=self.spec_hash,
            accelerator=self.identity.accelerator or engine.accelerator,
        )  # fmt: skip
        if marker is not None:
            self.totals.chunks_done += 1
            self.progress.finish_chunk(entry.chunk, marker.rows, marker.errors)

    def _take(self, buffer: list[RowResult], finished: list[RowResult]) -> None:
        if finished:
            buffer.extend(finished)
            with self._lock:
                self.totals.add(finished)
            self.progress.advance(len(finished), self.totals)

    def _flush(self, job: ChunkJob, buffer: list[RowResult]) -> None:
        job.checkpoint(buffer)
        self._publish()

    def _requests(self, entry: ManifestEntry, skip: set[int], side_errors: list[RowResult]) -> Iterator[EngineRequest]:
        """The chunk's lines as engine requests, streamed; bad lines go to `side_errors` instead."""
        with self.store.open(self.layout.chunk(entry.chunk)) as f:
            for index, line in enumerate(f):
                if index in skip:
                    continue
                parsed = parse_request(line, index, self.spec.sampling)
                if isinstance(parsed, EngineRequest):
                    yield parsed
                else:
                    side_errors.append(parsed)

    # -- the engine, loaded once we know there is work -------------------------------------
    def _engine_loaded(self) -> Engine:
        if self._engine is None:
            self._publish(state="loading")
            self.progress.note(f"loading {self.spec.model.engine} engine for {self.spec.model.name}")
            self._engine = self.engine_factory()
            if self.identity.accelerator is None:
                self.identity.accelerator = self._engine.accelerator
            self._publish(state="running", accelerator=self.identity.accelerator)
        return self._engine

    # -- lease renewal and heartbeat, in the background --------------------------------------
    def _background(self) -> None:
        interval = min(self.settings.heartbeat_interval, self.settings.lease_ttl / 3)
        while not self._stop.wait(interval):
            with self._lock:
                keeper = self._keeper
            if keeper is not None:
                with contextlib.suppress(LeaseLost):
                    keeper.renew_if_due()
            with contextlib.suppress(Exception):
                self._publish()

    def _publish(self, **updates: Any) -> None:
        with self._lock:
            t = self.totals
            fields = dict(
                chunk=t.chunk, chunk_rows=t.chunk_rows, chunk_rows_done=t.chunk_rows_done,
                chunks_done=t.chunks_done, rows_done=t.requests, errors=t.errors,
                tokens_in=t.tokens_in, tokens_out=t.tokens_out, tokens_per_s=t.tokens_per_s(),
                rows_per_s=t.rows_per_s() or 0.0, updated_at=self.clock(),
            )  # fmt: skip
            fields.update(updates)
            self._publisher.publish(**fields)

    # -- run records -------------------------------------------------------------------------
    def _manifest(self) -> list[ManifestEntry]:
        try:
            return read_jsonl(ManifestEntry, self.store.get(self.layout.manifest).data, self.layout.manifest)
        except NotFound:
            from orchestrator.errors import RunNotFound

            raise RunNotFound(
                f"run {self.layout.run!r} has no manifest in {self.store.uri}", hint="run `orch prepare` first"
            ) from None

    def _plan(self) -> PlanRecord:
        try:
            return parse_record(PlanRecord, self.store.get(self.layout.plan).data, self.layout.plan)
        except NotFound:
            from orchestrator.errors import RunNotFound

            raise RunNotFound(
                f"run {self.layout.run!r} has no plan in {self.store.uri}", hint="run `orch plan` first"
            ) from None


def install_signal_handlers(worker: Worker) -> None:
    """SIGTERM (spot preemption notice, `orch cancel`) and SIGINT: flush finished rows, then stop."""

    def handler(signum: int, frame: Any) -> None:
        worker.request_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def summary_line(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=False)

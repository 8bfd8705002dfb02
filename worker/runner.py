"""The worker's loop: claim a chunk, resume it, keep the engine saturated, checkpoint, mark it done; repeat.

One `Worker` is one process with one engine. Per chunk:
1. Take the lease (ChunkClaimer); skip the chunk if its marker appeared meanwhile.
2. Resume: rows already in checkpointed parts are not run again.
3. Stream the chunk's request lines into the engine, which pulls them as it has room; bad lines
   become error rows without reaching the engine. Once the chunk is handed over and the engine
   has room it cannot fill, steps 1-2 run for the next chunk, whose requests fill the batch while
   the current chunk's last rows finish: one engine run over all our chunks, never drained
   between two of them, and never more than two chunks in hand (worker/feed.py).
4. Every `checkpoint_interval` seconds (or MAX_BUFFERED_ROWS rows) flush a chunk's finished rows
   as a part (renewing its lease first); on SIGTERM/SIGINT flush what is finished, give the
   leases back and stop.
5. When every row of a chunk is flushed, write its done marker (create-if-absent).
A background thread (worker/heartbeat.py) renews the leases and publishes the heartbeat (at once after
a flush or a new chunk; the loop never waits on it, so a slow store costs heartbeats, not engine time);
if a lease is lost, the loop drops that chunk (and aborts its requests) at the next engine step. The
loop's own store requests, steps 1-5's, each renew the lease first, which fences their rows.

A store that does not answer (core/protocol/outage.py) stops nothing that can go on without it:
a chunk's input is copied to local disk when the chunk is opened, so the engine finishes every
row in hand; finished rows stay in memory, flushed once the store answers again; no new chunk
is claimed meanwhile. A lease that expires before it could be renewed is treated as lost (the
chunk is dropped, and claiming decides later who continues it from its checkpoints). When the
store stays unreachable for `store_settings.outage_budget` seconds the worker exits with
WorkerExit.STORE_UNREACHABLE: started again, not counted as a failure.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.core.errors import RunNotFound
from orchestrator.core.exits import WorkerStatus
from orchestrator.core.frozen_spec import spec_hash
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.claims import ChunkClaimer, PlanIndex, RunView, pool_share
from orchestrator.core.protocol.clocks import StoreClock
from orchestrator.core.protocol.leases import LeaseKeeper, LeaseLost
from orchestrator.core.protocol.outage import Outage, OutageTooLong
from orchestrator.core.records import ManifestEntry, PlanRecord, read_manifest, read_plan
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import Store, StoreUnavailable
from worker.chunks import ChunksInHand, OpenChunk, open_chunk
from worker.engine.base import Engine
from worker.feed import RequestFeed
from worker.heartbeat import HeartbeatThread, WorkerIdentity
from worker.progress import ProgressReporter
from worker.totals import Totals
from worker.wire import RowResult

log = logging.getLogger("orch.worker")

#: Finished rows held between checkpoints, at most: bounds the worker's memory when the engine
#: outruns the checkpoint interval (a fast GPU, short answers), whatever the chunk's size.
MAX_BUFFERED_ROWS = 4096
#: Chunks with rows in the engine at once: the one finishing, and the next that fills the batch as it drains.
MAX_CHUNKS_IN_ENGINE = 2


class Shutdown(Exception):
    """A stop was asked for (SIGTERM/SIGINT, `orch cancel`, an older twin): finished rows were
    flushed and the leases given back. `status` is the summary's: INTERRUPTED, or DUPLICATE for
    the newer of two processes of one worker id (it exits 0: the older one does the work)."""

    def __init__(self, status: WorkerStatus = WorkerStatus.INTERRUPTED):
        super().__init__(status.value)
        self.status = status


class Worker:
    """One process's work on a run: the loop above, over the chunks it holds (worker/chunks.py)."""

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
        chunks_in_engine: int = MAX_CHUNKS_IN_ENGINE,
        pool: str | None = None,
    ):
        self.store = store
        #: A run of several models: the model this worker loaded; it claims only that model's chunks.
        self.pool = pool
        self.spec = spec
        self.layout: RunLayout = spec.layout
        self.identity = identity
        self.engine_factory = engine_factory
        self.clock = clock
        self.max_chunks = max_chunks
        #: 1: each chunk drains before the next is claimed (the benchmark's ablation).
        self.chunks_in_engine = chunks_in_engine
        self.settings = spec.workers
        self.spec_hash = spec_hash(spec)
        #: The run's schema, which its request lines reference (read from the store with the spec).
        self.schemas = RunSchemas.of(spec.input.response_format)
        self.totals = Totals(started_at=clock())
        self.progress = progress or ProgressReporter(stream=sys.stderr)
        self._engine: Engine | None = None
        self.outage = Outage(spec.store_settings.outage_budget)
        self._opened = 0
        #: Guards the totals and the chunks in hand; never held across a store request, so the
        #: engine loop never waits on the network for the heartbeat thread.
        self._lock = threading.Lock()
        self.chunks = ChunksInHand(self.totals, self._lock)
        #: Our clock against the store's: leases are judged by the store's (protocol/clocks.py).
        self.store_clock = StoreClock(clock, report=self._clock_note)
        self.heartbeat = HeartbeatThread(
            store,
            self.layout,
            identity.first_heartbeat(self.totals.started_at),
            settings=self.settings,
            totals=self.totals,
            keepers=self.chunks.keepers,
            in_hand=self.chunks.rows_in_hand,
            lock=self._lock,
            clock=clock,
            progress=self.progress,
            store_down=self._store_down,
            store_ok=self._store_ok,
            stopping=lambda: self._shutdown_requested,
            request_stop=self.request_stop,
            store_clock=self.store_clock,
        )

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Work until no chunk is left for us. Returns the summary; raises Shutdown on SIGTERM."""
        started = self.clock()
        manifest = read_manifest(self.store, self.layout)
        plan = read_plan(self.store, self.layout)
        if plan is None:
            raise RunNotFound(f"run {self.layout.run!r} has no plan in {self.store.uri}", hint="run `orch plan` first")
        plan, manifest = pool_share(plan, manifest, self.pool)
        if not manifest:  # as vLLM's run_batch: an empty input is answered by an empty output
            log.warning("run %s has no rows (its input was empty): nothing to do", self.layout.run)
        entries = {e.chunk: e for e in manifest}
        claimer = self._claimer(plan, manifest)
        twin = self.heartbeat.older_twin_before_start()
        if twin is not None:
            # Nothing claimed, nothing loaded, nothing published: our first heartbeat would delete
            # the twin's key (the publisher takes other holders' keys for a dead predecessor's),
            # and the controller would read the id as exited and launch it again.
            self.heartbeat.note_twin(twin)
            self.progress.close()
            raise Shutdown(WorkerStatus.DUPLICATE)
        if self._shutdown_requested:
            raise Shutdown(self._stop_status)  # SIGTERM while we waited on a twin: nothing in hand
        self.heartbeat.start()
        self.heartbeat.publish()  # measures our clock against the store's before any lease is judged
        status = WorkerStatus.SUCCESS
        try:
            self._work(claimer, entries)
        except Shutdown as stop:
            status = stop.status
            raise
        except OutageTooLong:
            status = WorkerStatus.STORE_UNREACHABLE
            raise
        except BaseException:
            status = WorkerStatus.FAILED
            # Whatever failed (the engine, the store), our chunks are free for others at once; after
            # an engine failure, as a dead holder's (a row of theirs may have caused it).
            for active in self.chunks.drop_all():
                with contextlib.suppress(Exception):
                    active.keeper.release(died=self._engine_failed)
            raise
        finally:
            self._exit(status)
        return self.totals.summary(self.clock() - started, status)

    def _claimer(self, plan: PlanRecord, manifest: list[ManifestEntry]) -> ChunkClaimer:
        index = PlanIndex.build(
            plan, {e.chunk: float(e.est_tokens) for e in manifest}, {e.chunk: e.edge_prefixes for e in manifest}
        )
        return ChunkClaimer(
            store=self.store,
            layout=self.layout,
            view=RunView(self.store, self.layout, index),
            worker=self.identity.worker,
            holder=self.identity.holder,
            ttl=self.settings.lease_ttl,
            clock=self.clock,
            own=self.identity.own,
            rows_per_s=self.totals.measured_rows_per_s,
            store_clock=self.store_clock,
        )

    def _work(self, claimer: ChunkClaimer, entries: dict[str, ManifestEntry]) -> None:
        first = self._open_next_waiting(claimer, entries)
        while first is not None:
            engine = self._engine_loaded()  # loaded for the first chunk
            self._pump(engine, claimer, entries, first)
            self._settle(engine)  # what the store did not take while it was down
            # One more look once the engine has drained: leases that expired meanwhile, a
            # slow worker's chunk to rescue.
            first = self._open_next_waiting(claimer, entries)
        if self._shutdown_requested:
            raise Shutdown(self._stop_status)  # asked between two chunks: nothing in hand

    def _exit(self, status: WorkerStatus) -> None:
        """The heartbeat's last word (exited, with the exit code), then the engine closed."""
        self.heartbeat.stop(timeout=5)
        with contextlib.suppress(Exception):
            self.heartbeat.publish(state="exited", chunk=None, exit_code=status.exit_code.value)
        if self._engine is not None:
            self._engine.close()
        self.progress.close()

    def request_stop(self, why: str | None = None, status: WorkerStatus = WorkerStatus.INTERRUPTED) -> None:
        """Called from the signal handler (and the heartbeat thread): the loop flushes and stops
        at the next engine step."""
        if why and not self._shutdown_requested:
            self.progress.note(why)
        self._stop_status = status
        self._shutdown_requested = True

    _shutdown_requested = False

    def _clock_note(self, line: str) -> None:
        """A clock found off the store's (ours, or a peer's through its lease): in the worker's log."""
        self.progress.note(f"worker {self.identity.worker}: {line}")

    def abandon_loading(self) -> dict[str, Any]:
        """Stopped while the engine is built: the chunks claimed go back at once (not at their
        lease's expiry) and the heartbeat says exited. Returns the summary line's numbers."""
        self.heartbeat.stop()
        self.chunks.give_back_all()
        status = WorkerStatus.INTERRUPTED
        with contextlib.suppress(Exception):
            self.heartbeat.publish(state="exited", chunk=None, exit_code=status.exit_code.value)
        summary = self.totals.summary(self.clock() - self.totals.started_at, status)
        summary.update(worker=self.identity.worker, holder=self.identity.holder, accelerator=self.identity.accelerator)
        return summary

    #: The engine is being built: a stop then interrupts the build (see install_signal_handlers).
    loading = False
    _stop_status = WorkerStatus.INTERRUPTED

    def _pump(self, engine: Engine, claimer: ChunkClaimer, entries: dict[str, ManifestEntry], first: OpenChunk) -> None:
        """Steps 3-5 of the module docstring, for every chunk we get, through one engine run."""
        self.totals.busy_since = time.monotonic()
        self.totals.busy_cpu_since = time.process_time()
        feed = RequestFeed(
            self.chunks,
            self.spec,
            schemas=self.schemas,
            chunks_in_engine=self.chunks_in_engine,
            stopping=lambda: self._shutdown_requested,
            store_waits=lambda: self.outage.down and not self.outage.ready(),
            open_next=lambda: self._open_next(claimer, entries),
            store_down=self._store_down,
            flush=self._checkpoint,
        )
        try:
            with contextlib.closing(engine.run(feed.requests(engine, first))) as steps:
                while (finished := self._engine_step(steps, feed)) is not None:
                    self._count(self.chunks.route(finished))
                    self._after_step(engine)
            self._after_step(engine)  # chunks whose last lines were bad (never reached the engine)
        finally:
            with self._lock:
                self.totals.busy_s, self.totals.busy_since = self.totals.busy(), None
                self.totals.busy_cpu_s, self.totals.busy_cpu_since = self.totals.busy_cpu(), None

    def _settle(self, engine: Engine) -> None:
        """After the engine drained: flush and complete the chunks still in hand, which only a
        store that did not answer leaves behind, waiting for it (within the outage budget).
        A chunk with rows the engine never finished (it stopped early) is given back at once."""
        while self.chunks.open:
            for active in [a for a in self.chunks.open.values() if not (a.fed and a.outstanding == 0)]:
                self.chunks.give_back(active)
            if self.chunks.open:
                self._after_step(engine)
            if self.chunks.open and not self.outage.down:
                for active in list(self.chunks.open.values()):  # not for want of a store: never left waiting
                    self.chunks.give_back(active)
            if self.chunks.open:
                self._wait_for_store()

    def _open_next_waiting(self, claimer: ChunkClaimer, entries: dict[str, ManifestEntry]) -> OpenChunk | None:
        """The next chunk, waiting through a store outage (within the budget) to get it."""
        while True:
            try:
                return self._open_next(claimer, entries)
            except StoreUnavailable as e:
                self._store_down(e)
                self._wait_for_store()

    def _wait_for_store(self) -> None:
        """Sleep until the next try at the store (waking for a stop request); raise when the budget is spent."""
        self.outage.check_budget(f"worker {self.identity.worker}")
        until = time.monotonic() + max(self.outage.pause_s(), 0.05)
        # One clock read a turn: two could straddle `until` and ask time.sleep for a negative pause.
        while (left := until - time.monotonic()) > 0 and not self._shutdown_requested:
            time.sleep(min(0.2, left))
        if self._shutdown_requested:
            raise Shutdown(self._stop_status)
        self.outage.check_budget(f"worker {self.identity.worker}")

    def _engine_step(self, steps: Iterator[list[RowResult]], feed: RequestFeed) -> list[RowResult] | None:
        """The rows the engine's next step finished (None at the end). An exception from the engine
        itself, not from our own feed, marks the worker as crashed: its chunks are then given up as
        a dead holder's would be (core/protocol/crashes.py), since a row may have caused it."""
        try:
            return next(steps)
        except StopIteration:
            return None
        except Exception as e:
            if e is not feed.error:
                self._engine_failed = True
            raise

    _engine_failed = False

    def _open_next(self, claimer: ChunkClaimer, entries: dict[str, ManifestEntry]) -> OpenChunk | None:
        """Step 1 and 2: take the next chunk's lease and resume it."""
        if self._shutdown_requested or (self.max_chunks is not None and self._opened >= self.max_chunks):
            return None
        unopened = self.chunks.unopened
        held = unopened.pop(0) if unopened else claimer.next_chunk(working_on=self.chunks.open.keys())
        self._store_ok()
        if held is None:
            return None
        entry = entries[held.chunk]
        keeper = self.chunks.keepers.get(entry.chunk) or LeaseKeeper(
            self.store, self.layout, held, ttl=self.settings.lease_ttl, clock=self.clock
        )
        self.chunks.hold(entry.chunk, keeper)  # renewed in the background from here on
        try:
            self._engine_loaded()  # the first time: once we know there is work
            active = open_chunk(self.store, self.layout, entry, keeper, self.settings.output_format, self.clock)
        except StoreUnavailable:
            if keeper.lost is None:
                self.chunks.unopened.insert(0, keeper.held)  # still ours: opened at the next try
            else:
                self.chunks.drop(entry.chunk)
            raise
        except BaseException:
            self.chunks.drop(entry.chunk)
            with contextlib.suppress(Exception):
                keeper.release()
            raise
        self.chunks.add(active)
        self._opened += 1
        self.heartbeat.soon(state="running")
        self.progress.start_chunk(entry.chunk, entry.rows, len(active.skip))
        return active

    def _after_step(self, engine: Engine) -> None:
        if self._shutdown_requested:
            engine.abort()
            for active in self.chunks.drop_all():
                with contextlib.suppress(LeaseLost, StoreUnavailable):  # a store that is down keeps nothing
                    self._flush(active)
                    active.keeper.release()
            raise Shutdown(self._stop_status)
        now = self.clock()
        self.outage.check_budget(f"worker {self.identity.worker}")
        for chunk, active in list(self.chunks.open.items()):
            try:
                if active.keeper.lost is None and self.outage.down and active.keeper.expired():
                    active.keeper.lose("it expired while the store was unreachable")
                if active.keeper.lost is not None:
                    raise active.keeper.lost
                if active.side_errors:
                    active.rows_done += len(active.side_errors)
                    active.buffer.extend(active.side_errors)
                    self._count(active.side_errors)
                    active.side_errors = []
                if not self.outage.ready():
                    continue  # the store is down: rows wait in memory for its next try
                if active.fed and active.outstanding == 0:
                    self._flush(active)
                    self._complete(active, engine)
                elif (
                    now - active.last_flush >= self.settings.checkpoint_interval
                    or len(active.buffer) >= MAX_BUFFERED_ROWS
                ):
                    self._checkpoint(active)
                self._store_ok()
            except StoreUnavailable as e:
                self._store_down(e)
            except LeaseLost as lost:
                self.chunks.drop(chunk)
                engine.abort(chunk)
                self.totals.chunks_lost += 1
                log.warning("worker %s: %s; dropping the chunk", self.identity.worker, lost)
                self.progress.note(f"{chunk}: {lost}; chunk dropped")

    def _count(self, rows: list[RowResult]) -> None:
        if rows:
            with self._lock:
                first = self.totals.requests == 0
                self.totals.add(rows)
            if first:  # at once, in the log and the heartbeat: `status` shows it within a beat
                self.progress.first_row(rows[0].chunk, self.clock() - self.totals.started_at)
                self.heartbeat.soon()
            self.progress.advance(self.totals)

    def _flush(self, active: OpenChunk) -> None:
        active.job.checkpoint(active.buffer)  # renews the lease first: LeaseLost if it is gone
        active.buffer = []
        self.heartbeat.soon()  # the progress, by the heartbeat thread: the engine goes on

    def _checkpoint(self, active: OpenChunk) -> None:
        """A flush of an unfinished chunk: the next is due a checkpoint interval from now."""
        self._flush(active)
        active.last_flush = self.clock()

    def _complete(self, active: OpenChunk, engine: Engine) -> None:
        marker = active.job.complete(
            worker=self.identity.worker,
            model=self.spec.model.name or "",
            spec_hash=self.spec_hash,
            accelerator=self.identity.accelerator or engine.accelerator,
        )
        self.chunks.drop(active.entry.chunk)
        if marker is not None:
            self.totals.chunks_done += 1
            self.progress.finish_chunk(active.entry.chunk, marker.rows, marker.errors)

    # -- the engine, loaded once we know there is work -------------------------------------
    def _engine_loaded(self) -> Engine:
        if self._engine is None:
            self.heartbeat.soon(state="loading")
            self.progress.note(f"loading {self.spec.model.engine} engine for {self.spec.model.name}")
            started, started_cpu = time.monotonic(), time.process_time()
            self.loading = True
            try:
                self._engine = self.engine_factory()
            finally:
                self.loading = False
            self.totals.load_s = time.monotonic() - started
            self.totals.load_cpu_s = time.process_time() - started_cpu
            self.totals.batch_rows = self._engine.batch_rows
            if self.identity.accelerator is None:
                self.identity.accelerator = self._engine.accelerator
            self.heartbeat.soon(state="running", accelerator=self.identity.accelerator, loaded=True)
        return self._engine

    # -- the store's availability ------------------------------------------------------------
    def _store_down(self, error: StoreUnavailable) -> None:
        if self.outage.failed(error):
            with self._lock:
                held = sum(len(a.buffer) for a in self.chunks.open.values())
            message = (
                f"store unreachable ({error}); finished rows stay in memory ({held} now) and are flushed when it "
                f"answers; no new chunk meanwhile; giving up after {self.outage.budget_s:g}s"
            )
            self.progress.note(message)

    def _store_ok(self) -> None:
        lasted = self.outage.recovered()
        if lasted is not None:
            self.progress.note(f"store reachable again after {lasted:.0f}s; flushing what was kept")

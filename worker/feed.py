"""What the engine is fed: our chunks' requests one chunk after another, the next chunk claimed just in time.

The engine pulls requests as it has room (worker/engine/base.py). The feed hands over a chunk's
request lines (the run's sampling over the model's defaults), then claims the next chunk only once
the engine has room the chunks in it cannot fill: fewer than `capacity` rows unfinished, and at
most `chunks_in_engine - 1` other chunks still in it. Until then the engine hears "nothing for now"
(None), so a worker never holds leases on more than it is about to work on. A chunk that crashed
before (core/protocol/crashes.py) is fed a group at a time, alone in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from orchestrator.core.protocol.crashes import careful_groups
from orchestrator.core.protocol.leases import LeaseLost
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import StoreUnavailable
from worker.bodies import with_model_defaults
from worker.chunks import ChunksInHand, OpenChunk
from worker.engine.base import Engine
from worker.wire import EngineRequest


class RequestFeed:
    """The requests of one engine run over every chunk we get. What the worker's loop does for it
    comes in as callables: whether a stop was asked for, whether the store is down and not yet
    worth another try, claiming and opening the next chunk, noting a store that did not answer,
    and flushing a chunk's finished rows."""

    def __init__(
        self,
        chunks: ChunksInHand,
        spec: RunSpec,
        *,
        schemas: RunSchemas,
        chunks_in_engine: int,
        stopping: Callable[[], bool],
        store_waits: Callable[[], bool],
        open_next: Callable[[], OpenChunk | None],
        store_down: Callable[[StoreUnavailable], None],
        flush: Callable[[OpenChunk], None],
    ):
        self.chunks = chunks
        self.spec = spec
        #: The run's schema, which its request lines reference by digest.
        self.schemas = schemas
        self.chunks_in_engine = chunks_in_engine
        self.stopping = stopping
        self.store_waits = store_waits
        self.open_next = open_next
        self.store_down = store_down
        self.flush = flush
        #: What made the feed itself fail (the store, a claim): an engine's exception is anything else.
        self.error: BaseException | None = None

    def requests(self, engine: Engine, first: OpenChunk) -> Iterator[EngineRequest | None]:
        """The requests of `first` and of the chunks claimed after it, for `engine.run`."""
        try:
            yield from self._chunks(engine, first)
        except Exception as e:
            self.error = e
            raise

    def _chunks(self, engine: Engine, active: OpenChunk | None) -> Iterator[EngineRequest | None]:
        while active is not None:
            sampling = with_model_defaults(self.spec.sampling, engine.sampling_defaults)
            requests = active.requests(
                sampling, self.spec.requests.unknown_fields, self.chunks.note_ignored, self.schemas
            )
            if active.careful:
                yield from self._carefully(active, requests)
            else:
                for request in requests:  # ends early when the chunk is dropped (OpenChunk.requests)
                    request.chunk = active.entry.chunk
                    active.outstanding += 1
                    yield request
            active.fed = True
            while not self.stopping() and not self.chunks.room_for_another(engine.capacity, self.chunks_in_engine):
                yield None
            if self.stopping() or self.store_waits():
                return  # the engine finishes what it has; the worker waits for the store, then goes on
            try:
                active = self.open_next()
            except StoreUnavailable as e:
                self.store_down(e)
                return

    def _carefully(self, active: OpenChunk, requests: Iterator[EngineRequest]) -> Iterator[EngineRequest | None]:
        """A chunk that crashed before (core/protocol/crashes.py, step 2): a group at a time, alone
        in the engine, each group noted in the lease before it is handed over. The rows of the
        group before are flushed first: a later holder never runs a finished suspect again."""
        chunk = active.entry.chunk
        lease = active.keeper.held.lease
        for group in careful_groups(requests, lambda r: r.index, set(lease.suspects), set(lease.lone_deaths)):
            # Rows of other chunks in the engine would share this group's fate: let them finish first.
            while not self.stopping() and any(a.outstanding for a in self.chunks.open.values()):
                yield None
            if self.stopping() or chunk not in self.chunks.open:
                return
            try:
                if active.buffer:
                    self.flush(active)
                active.keeper.note_in_flight([r.index for r in group])
            except LeaseLost:
                return  # the next step drops the chunk
            for request in group:
                if active.dropped:
                    return  # lost while the group was handed over: the rest is someone else's
                request.chunk = chunk
                active.outstanding += 1
                yield request

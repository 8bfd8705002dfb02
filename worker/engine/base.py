"""What an engine is to the worker: pull requests lazily, yield finished rows after every step."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any, Protocol

from worker.wire import EngineRequest, RowResult


class Engine(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def accelerator(self) -> str | None:
        """What it runs on: "cpu", or the GPU's name ("NVIDIA L4")."""

    @property
    def capacity(self) -> int:
        """How many requests it works on at once (vLLM's max_num_seqs): the worker keeps at least
        this many in its hands before it claims another chunk."""

    @property
    def batch_rows(self) -> int:
        """The most rows one engine step runs together (vLLM's max_num_seqs, the transformers
        engine's max_batch_size; its pool, `capacity`, holds two batches): a probe's first batch,
        which carries the engine's warm-up, ends when this many rows are done (worker/totals.py)."""

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """The model's own sampling defaults (temperature, top_p... from its generation_config.json,
        as vLLM's server reads them): what a request and the spec leave unset."""

    def run(self, requests: Iterator[EngineRequest | None]) -> Generator[list[RowResult], None, None]:
        """Pull requests as the engine has room (a bounded window, so a 100,000-row chunk never
        sits in memory), and yield after every engine step the rows that finished in it, possibly
        none, so the caller can checkpoint and check for stop requests between steps. Ends when
        the requests are exhausted and every row has finished. Requests may come from several
        chunks: each row result carries its request's chunk.

        A `None` from `requests` means "nothing more for now": step what is in flight and ask
        again. The worker sends it only while rows it handed over are unfinished."""

    def abort(self, chunk: str | None = None) -> None:
        """Drop the requests in flight of one chunk (its lease was lost), or all of them (shutdown:
        the current run() ends)."""

    def close(self) -> None: ...


def take_window(requests: Iterator[EngineRequest | None], size: int) -> list[EngineRequest] | None:
    """Up to `size` requests for an engine that works a window at a time: fewer when the worker
    has nothing more for now, None once the requests are exhausted."""
    window: list[EngineRequest] = []
    for request in requests:
        if request is None:
            return window
        window.append(request)
        if len(window) == size:
            return window
    return window or None

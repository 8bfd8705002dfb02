"""What an engine is to the worker: pull requests lazily, yield finished rows after every step."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from orchestrator.core.lines import BatchOutputLine
from worker.outputs import error_line

if TYPE_CHECKING:
    from worker.requests import EngineRequest


@dataclass
class RowResult:
    """One request's answer (or error) as its OpenAI Batch output line, with what the worker counts."""

    index: int
    custom_id: str | None
    line: BatchOutputLine
    tokens_in: int
    tokens_out: int
    error: bool
    #: The chunk the request came from (set by the engine from EngineRequest.chunk).
    chunk: str | None = None


def error_row(request: EngineRequest, code: str, message: str, param: str | None = None) -> RowResult:
    """The request's answer when it fails alone (a template error, a prompt too long, a parameter
    the engine cannot honour): an error line, counted as an error, in the request's chunk."""
    line = error_line(request.custom_id, code, message, param=param)
    return RowResult(request.index, request.custom_id, line, 0, 0, True, request.chunk)


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

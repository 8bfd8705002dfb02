"""What an engine is to the worker: pull requests lazily, yield finished rows after every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol

if TYPE_CHECKING:
    from worker.requests import EngineRequest


@dataclass
class RowResult:
    """One request's answer (or error) as its OpenAI Batch output line, with what the worker counts."""

    index: int
    custom_id: str | None
    line: dict[str, Any]
    tokens_in: int
    tokens_out: int
    error: bool


class Engine(Protocol):
    name: str
    #: What it runs on: "cpu", or the GPU's name ("NVIDIA L4").
    accelerator: str | None

    def run(self, requests: Iterator["EngineRequest"]) -> Iterator[list[RowResult]]:
        """Pull requests as the engine has room (a bounded window, so a 100,000-row chunk never
        sits in memory), and yield after every engine step the rows that finished in it, possibly
        none, so the caller can checkpoint and check for stop requests between steps. Ends when
        the requests are exhausted and every row has finished."""

    def abort(self) -> None:
        """Drop the requests in flight (lease lost, shutdown); the current run() ends."""

    def close(self) -> None: ...

"""What the worker prints while it works: a progress bar on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class ProgressReporter:
    """Progress on stderr; stdout is kept for the JSON summary line that schedulers parse.

    The numbers come from the worker's Totals: the chunk in hand (`chunk`, `chunk_rows`,
    `chunk_rows_done`), tokens/s and errors.
    """

    def __init__(self, stream: TextIO = sys.stderr, *, every_s: float = 30.0, interactive: bool | None = None):
        self.stream = stream
        self.every_s = every_s
        self.interactive = stream.isatty() if interactive is None else interactive
        self._last = 0.0
        self._started: dict[str, float] = {}  # chunk -> when it was taken

    def note(self, text: str) -> None:
        self._clear_bar()
        print(f"[orch worker] {text}", file=self.stream, flush=True)

    def start_chunk(self, chunk: str, rows: int, already_done: int) -> None:
        self._started[chunk] = self._last = time.monotonic()
        resumed = f", resuming after {already_done} flushed rows" if already_done else ""
        self.note(f"{chunk}: {rows} rows{resumed}")

    def advance(self, totals: Any) -> None:
        """Rows finished: redraw the bar, or print a line every `every_s` seconds."""
        now = time.monotonic()
        if self.interactive:
            self._draw_bar(totals)
        elif now - self._last >= self.every_s:
            self._last = now
            self.note(self._status(totals))

    def finish_chunk(self, chunk: str, rows: int, errors: int) -> None:
        took = time.monotonic() - self._started.pop(chunk, time.monotonic())
        self.note(f"{chunk}: done, {rows} rows ({errors} errors) in {took:.1f}s")

    def close(self) -> None:
        self._clear_bar()

    def _status(self, totals: Any) -> str:
        done, rows = totals.chunk_rows_done, totals.chunk_rows
        pct = 100.0 * done / rows if rows else 100.0
        return (
            f"{totals.chunk}: {done}/{rows} rows ({pct:.0f}%), "
            f"{totals.tokens_per_s():.1f} tok/s, {totals.errors} errors so far"
        )

    def _draw_bar(self, totals: Any) -> None:
        width = 30
        rows = totals.chunk_rows
        filled = int(width * totals.chunk_rows_done / rows) if rows else width
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r[{bar}] {self._status(totals)}\x1b[K")
        self.stream.flush()

    def _clear_bar(self) -> None:
        if self.interactive:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

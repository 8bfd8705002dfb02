"""What the worker prints while it works: a tqdm bar on a terminal, periodic plain lines otherwise (logs).

Progress goes to stderr; stdout is kept for the JSON summary line that schedulers parse. The numbers
come from the worker's Totals: the chunk in hand (`chunk`, `chunk_rows`, `chunk_rows_done`),
tokens/s and errors.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

PREFIX = "[orch worker]"


class ProgressReporter:
    def __init__(self, stream: TextIO = sys.stderr, *, every_s: float = 30.0, interactive: bool | None = None):
        self.stream = stream
        self.every_s = every_s
        self.interactive = stream.isatty() if interactive is None else interactive
        self._last = 0.0
        self._started: dict[str, float] = {}  # chunk -> when it was taken
        self._bar: Any = None  # a tqdm bar over the chunk in hand (terminal only)

    def note(self, text: str) -> None:
        line = f"{PREFIX} {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)  # above the bar, which is redrawn below
        else:
            print(line, file=self.stream, flush=True)

    def start_chunk(self, chunk: str, rows: int, already_done: int) -> None:
        self._started[chunk] = self._last = time.monotonic()
        resumed = f", resuming after {already_done} flushed rows" if already_done else ""
        self.note(f"{chunk}: {rows} rows{resumed}")

    def first_row(self, chunk: str | None, after_s: float) -> None:
        """The process's first answered row: the moment `orch status` can show progress."""
        self.note(f"first row answered ({chunk}), {after_s:.1f}s after the worker started")

    def advance(self, totals: Any) -> None:
        """Rows finished: move the bar, or print a line every `every_s` seconds."""
        if self.interactive:
            self._draw_bar(totals)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.note(self._status(totals))

    def finish_chunk(self, chunk: str, rows: int, errors: int) -> None:
        took = time.monotonic() - self._started.pop(chunk, time.monotonic())
        self.note(f"{chunk}: done, {rows} rows ({errors} errors) in {took:.1f}s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @staticmethod
    def _status(totals: Any) -> str:
        done, rows = totals.chunk_rows_done, totals.chunk_rows
        pct = 100.0 * done / rows if rows else 100.0
        return (
            f"{totals.chunk}: {done}/{rows} rows ({pct:.0f}%), "
            f"{totals.tokens_per_s():.1f} tok/s, {totals.errors} errors so far"
        )

    def _draw_bar(self, totals: Any) -> None:
        from tqdm import tqdm

        if self._bar is None or self._bar.desc != totals.chunk:
            self.close()
            self._bar = tqdm(
                total=totals.chunk_rows,
                initial=totals.chunk_rows_done,
                desc=totals.chunk,
                unit="row",
                file=self.stream,
                dynamic_ncols=True,
                leave=False,
            )
        self._bar.n = totals.chunk_rows_done
        self._bar.set_postfix_str(f"{totals.tokens_per_s():.0f} tok/s, {totals.errors} errors", refresh=False)
        self._bar.refresh()

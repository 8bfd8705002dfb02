"""How the controller shows things to people: rich tables and live views on a terminal, plain text elsewhere.

Every table orch prints is built with `table()` and printed through `console()`; views that redraw
(`orch status --watch`, the follow loop of `orch run` / `watch`) go through `LiveView`. Off a
terminal (logs, CI, pipes) the same renderables come out as plain, unwrapped text without colour
codes, and a live view prints nothing by itself: its callers print one line per tick instead.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

#: Off a terminal nothing is wrapped: a log line or a pipe gets the whole row.
_UNWRAPPED = 100_000

__all__ = ["Group", "LiveView", "Table", "Text", "console", "table", "to_text"]


def console(file: TextIO | None = None) -> Console:
    """A console on stdout (or `file`): colour on a terminal, plain unwrapped text otherwise."""
    file = file or sys.stdout
    return Console(file=file, highlight=False, width=None if file.isatty() else _UNWRAPPED)


def table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    """A borderless table with bold headers, the columns named in `right` right-aligned (numbers)."""
    grid = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name in columns:
        grid.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    return grid


def to_text(renderable: RenderableType) -> str:
    """What the renderable prints off a terminal: for tests, reports and logs."""
    buffer = io.StringIO()
    Console(file=buffer, highlight=False, width=_UNWRAPPED, color_system=None).print(renderable)
    return buffer.getvalue().rstrip("\n")


class LiveView:
    """A view redrawn in place on a terminal (rich's Live); `active` is False elsewhere."""

    def __init__(self, out: Console):
        self.active = out.is_terminal
        self._live = Live(console=out, auto_refresh=False, transient=False) if self.active else None

    def show(self, renderable: RenderableType) -> None:
        if self._live is not None:
            self._live.update(renderable, refresh=True)

    @contextmanager
    def running(self) -> Iterator[LiveView]:
        if self._live is None:
            yield self
            return
        with self._live:
            yield self

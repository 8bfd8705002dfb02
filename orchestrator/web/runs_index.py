"""The runs index (`/runs/`): each run a viewer may see, a row each with its state (the word `orch
runs` and `orch status` show), chunks, rows, errors, cost, model and input, linking to its page.

Statuses come from the snapshots (web/snapshots.py: a run's reading is shared with its page), through
`statuses_of`, as `orch runs` reads them (runview/runs.py), each with its model and input. At most
MAX_RUNS runs are listed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote

from orchestrator.runview.runs import statuses_of
from orchestrator.runview.states import RunState
from orchestrator.runview.words import duration
from orchestrator.web.page import Page, template
from orchestrator.web.snapshots import Snapshot

#: Runs listed on the index; the rest are named by `orch runs`.
MAX_RUNS = 200


@dataclass(frozen=True)
class IndexRow:
    run: str
    #: The run's page, relative to the server's root.
    href: str
    state: str
    backend: str = "-"
    chunks: str = ""
    rows: str = ""
    errors: str = ""
    cost: str = ""
    model: str = "-"
    input: str = "-"
    age: str = "-"
    #: When its status was read (HH:MM:SS).
    read_at: str = "-"
    #: What is wrong with a run whose records cannot be read, or why its latest reading failed.
    problem: str | None = None


def index_rows(names: Iterable[str], snapshot: Callable[[str], Snapshot], now: float | None = None) -> list[IndexRow]:
    """A row per run of `names` (the first MAX_RUNS), its status from `snapshot(name)` (the
    snapshots' `get`; OrchError for a run that cannot be read: shown as UNREADABLE)."""
    now = time.time() if now is None else now
    rows = []
    listed = [name for _, name in zip(range(MAX_RUNS), names, strict=False)]
    for snap in statuses_of(listed, snapshot):
        if not isinstance(snap, Snapshot):
            rows.append(IndexRow(snap[0], _href(snap[0]), "UNREADABLE", problem=snap[1]))
            continue
        r = snap.status
        rows.append(
            IndexRow(
                r.run,
                _href(r.run),
                str(r.state).upper(),
                r.backend or "-",
                f"{r.chunks.done}/{r.chunks.total}",
                f"{r.rows.done:,}/{r.rows.total:,}",
                f"{r.rows.errors:,}",
                f"${r.cost.so_far_usd:,.2f}",
                r.model or "-",
                r.input or "-",
                duration(now - r.prepared_at) + " ago" if r.prepared_at else "-",
                time.strftime("%H:%M:%S", time.localtime(snap.taken_at)),
                f"the latest reading failed ({snap.problem}): this is an older one" if snap.problem else None,
            )
        )
    return rows


def _href(run: str) -> str:
    return "/runs/" + quote(run, safe="")


def render_index(rows: list[IndexRow], where: str, refresh_s: float) -> Page:
    """The index page of `rows`, in the store named `where`. No script (the CSP allows none): while
    a run goes on, a meta refresh reads the index again every `refresh_s`, so a run that ends is
    shown ended without a reload."""
    going = any(row.state == str(RunState.RUNNING).upper() for row in rows)
    html = template("runs.html").render(
        rows=rows, where=where, max_runs=MAX_RUNS, refresh_s=max(int(refresh_s), 1) if going else None
    )
    return Page(html, script_hash="")

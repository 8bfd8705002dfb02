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
from orchestrator.runview.sections import RunStatus
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
    #: What is wrong with a run whose records cannot be read.
    problem: str | None = None


def index_rows(names: Iterable[str], snapshot: Callable[[str], Snapshot], now: float | None = None) -> list[IndexRow]:
    """A row per run of `names` (the first MAX_RUNS), its status from `snapshot(name)` (the
    snapshots' `get`; OrchError for a run that cannot be read: shown as UNREADABLE)."""
    now = time.time() if now is None else now
    rows = []
    listed = [name for _, name in zip(range(MAX_RUNS), names, strict=False)]
    for r in statuses_of(listed, lambda name: snapshot(name).status):
        if not isinstance(r, RunStatus):
            rows.append(IndexRow(r[0], _href(r[0]), "UNREADABLE", problem=r[1]))
            continue
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
            )
        )
    return rows


def _href(run: str) -> str:
    return "/runs/" + quote(run, safe="")


def render_index(rows: list[IndexRow], where: str) -> Page:
    """The index page of `rows`, in the store named `where`. No script: the CSP allows none."""
    return Page(template("runs.html").render(rows=rows, where=where, max_runs=MAX_RUNS), script_hash="")

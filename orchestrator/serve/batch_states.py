"""A served batch's statuses and the one table of moves between them: every change of status is a `transition`.

    validating ─► failed                      the input file has problems (errors.data); nothing launched
        │ prepare, plan, launch: the run named by the batch id, on the configured backend
        ▼
    in_progress ─► finalizing ─► completed    every chunk has its marker
        │     ├─► expiring ────► expired      past expires_at: workers cancelled, finished rows returned
        │     └─► failing ─────► failed       workers out of relaunches: finished rows returned
        ▼ POST /cancel (from validating or in_progress)
    cancelling ─► cancelled                   workers cancelled, finished rows returned

`expiring` and `failing` are ends decided but not yet written: the batch still reads in_progress
to clients (OpenAI has no such statuses) while its files are written, and a server killed in
between finishes the end it had decided. They are stored as the batch's `ending`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from orchestrator.core.errors import OrchError
from orchestrator.core.layout import ServeLayout
from orchestrator.core.records import BatchDocument, BatchStatus, cas_update
from orchestrator.core.store import Store

LAYOUT = ServeLayout()

#: Ends decided and not yet written, and the status each becomes.
EXPIRING, FAILING = "expiring", "failing"
_ENDS: dict[str, Literal["expired", "failed"]] = {EXPIRING: "expired", FAILING: "failed"}

#: Every move a batch may make, and what makes it. A move not listed here is never made.
MOVES: dict[tuple[str, str], str] = {
    ("validating", "in_progress"): "the input is valid: the run is prepared, planned and launched",
    ("validating", "failed"): "the input file has problems: nothing is launched",
    ("validating", "cancelling"): "POST /cancel",
    ("validating", EXPIRING): "the completion window ended before validation did",
    ("in_progress", "finalizing"): "every chunk has its marker",
    ("in_progress", "cancelling"): "POST /cancel, or `orch cancel` on the batch's run",
    ("in_progress", EXPIRING): "the completion window ended",
    ("in_progress", FAILING): "no worker can run the batch: relaunches spent",
    ("finalizing", "completed"): "the output and error files are written",
    ("cancelling", "cancelled"): "workers stopped; the finished rows' files are written",
    (EXPIRING, "expired"): "workers stopped; the finished rows' files are written",
    (FAILING, "failed"): "workers stopped; the finished rows' files are written",
}


class Outcome(enum.Enum):
    """What a transition did."""

    #: The batch moved.
    APPLIED = "applied"
    #: It was there already: a step taken again (after a restart, or by a second server).
    ALREADY = "already there"
    #: The table has no such move from where the batch is: it moved meanwhile.
    NOT_ALLOWED = "not allowed"

    @property
    def there(self) -> bool:
        """The batch is where the transition meant it to be (moved now, or before)."""
        return self is not Outcome.NOT_ALLOWED


@dataclass(frozen=True)
class Transition:
    outcome: Outcome
    #: The batch as it is after the attempt (moved or not).
    batch: BatchDocument


def state_of(batch: BatchDocument) -> str:
    """Where the batch is in the table: its status, or the end decided for it."""
    return batch.status if batch.ending is None else ending_state(batch.ending)


def transition(
    store: Store, batch_id: str, to: str, *, now: int, changes: Mapping[str, Any] | None = None
) -> Transition:
    """Move the batch to `to` if the table allows it from where it is now, stamping the time of
    the new status (`<status>_at`, or `ending_at` for a decided end) and writing `changes` with it.
    A compare-and-swap: a move made meanwhile by another writer is seen and judged again."""
    outcome = Outcome.NOT_ALLOWED

    def move(doc: BatchDocument | None) -> BatchDocument | None:
        nonlocal outcome
        if doc is None:
            raise OrchError(f"batch {batch_id} has no document", where=LAYOUT.batch(batch_id))
        here = state_of(doc)
        outcome = Outcome.ALREADY if here == to else Outcome.APPLIED if (here, to) in MOVES else Outcome.NOT_ALLOWED
        if outcome is not Outcome.APPLIED:
            return None
        if to in _ENDS:
            doc.ending, doc.ending_at = _ENDS[to], now
        else:
            doc.status, doc.ending = cast(BatchStatus, to), None  # every other target in MOVES is a status
            setattr(doc, f"{to}_at", now)
        for name, value in (changes or {}).items():
            setattr(doc, name, value)
        return doc

    batch, _ = cas_update(store, LAYOUT.batch(batch_id), BatchDocument, move)
    assert batch is not None  # `move` raises when there is none
    return Transition(outcome, batch)


def ending_state(status: str) -> str:
    """The decided-end state that leads to a final `status` (expired -> expiring)."""
    return next(state for state, final in _ENDS.items() if final == status)

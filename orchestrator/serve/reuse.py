"""`serve: {reuse: true}`: a new batch reuses the answers of its own API key's earlier batches, never another key's.

The runs of the key's most recent finished batches (completed, expired, cancelled or failed after
running: their answered rows are real answers) become the batch run's `reuse.from`, newest first,
at most REUSE_BATCHES of them. Prepare then looks each row's answer key up in their answer indexes
(prepare/answers/reuse.py), a part at a time; only the other rows reach the engine. Each batch's index
also holds the rows it reused itself, so the newest batches carry their predecessors' answers on.
"""

from __future__ import annotations

import itertools

from orchestrator.core.errors import CorruptRecord, InputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ReuseRecord, read_batch, read_record
from orchestrator.core.store import NotFound, Store
from orchestrator.prepare.answers.answer_index import read_index
from orchestrator.serve.batch_states import LAYOUT

#: Earlier batches a new one reuses from, at most: prepare reads each one's index a part at a time,
#: so memory and requests grow with this number, not with the key's history.
REUSE_BATCHES = 8
#: The owner's newest batches looked at to find them (a GET each), whatever became of them.
SCANNED_BATCHES = 64


def earlier_runs(store: Store, owner: str, batch_id: str, limit: int = REUSE_BATCHES) -> list[str]:
    """The runs of `owner`'s newest finished batches before `batch_id` with a usable answer index.

    The owner's index lists its batches newest first (ServeLayout.owned): the newest SCANNED_BATCHES
    are looked at. A batch still running, one that failed validation (no run) or one whose index is
    missing, damaged or of another key version is passed over, so an earlier batch's state never
    fails a new one.
    """
    runs: list[str] = []
    for info in itertools.islice(store.list(LAYOUT.owned_prefix(owner, "batches")), SCANNED_BATCHES):
        earlier = LAYOUT.id_of(info.key)
        batch = read_batch(store, LAYOUT, earlier) if earlier != batch_id else None
        if batch is None or batch.owner != owner or not batch.final:
            continue
        try:
            read_index(store, RunLayout(earlier))
        except (InputError, CorruptRecord):
            continue
        runs.append(earlier)
        if len(runs) >= limit:
            break
    return runs


def reused_custom_ids(store: Store, layout: RunLayout) -> set[str]:
    """The custom_ids of the batch's rows answered from earlier batches (empty without reuse).

    Held whole: a batch has at most serve.max_requests rows, and the driver holds every answered
    custom_id of it anyway (to write the error lines of rows never run)."""
    import orjson

    found = read_record(store, layout.reuse_record, ReuseRecord)
    if found is None or not found[0].rows:
        return set()
    try:
        data = store.get(layout.reused_ids).data
    except NotFound:
        return set()  # collect, which ran first, says what is missing
    return {str(orjson.loads(line)) for line in data.splitlines() if line}

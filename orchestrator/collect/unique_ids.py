"""Collect's guard that no custom_id is written on two lines.

Prepare refuses an input that repeats a custom_id; a run prepared before it did (a repeat was set
aside as a bad row, then answered by collect beside the first row's answer), or a store changed
under the run, could still hold two rows with one id. So every line collect writes has its id
kept as an 8-byte digest (8 bytes a row, not the ids themselves); before the output is published
the digests are sorted, and a repeat stops collect with no output, naming the ids: found again,
only then, among the run's rows (its chunks' requests, the rows set aside at prepare, the rows
reused from earlier runs).
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Iterator

from orchestrator.core.errors import OutputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import PrepareError, iter_jsonl, read_manifest
from orchestrator.core.store import NotFound, Store

#: Ids named in the error, with where each is.
SHOWN = 5


def _digest(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "little")


class WrittenIds:
    """The digests of the ids written so far."""

    def __init__(self) -> None:
        self.digests = array("Q")

    def add(self, custom_id: str | None) -> None:
        if custom_id is not None:  # a line without an id (a row set aside unread) repeats nothing
            self.digests.append(_digest(custom_id))

    def repeated(self) -> set[int]:
        """The digests written more than once."""
        import numpy as np

        ordered = np.sort(np.frombuffer(self.digests, dtype=np.uint64))
        return {int(d) for d in ordered[1:][ordered[1:] == ordered[:-1]]}

    def check(self, store: Store, layout: RunLayout) -> None:
        """An OutputError naming the repeated ids and where the run holds each; nothing when none repeats."""
        repeated = self.repeated()
        if not repeated:
            return
        places: dict[str, list[str]] = {}
        for custom_id, where in _rows(store, layout):
            if _digest(custom_id) in repeated:
                places.setdefault(custom_id, []).append(where)
        shown = [f"{custom_id!r}: {', '.join(where)}" for custom_id, where in list(places.items())[:SHOWN]]
        raise OutputError(
            f"{len(repeated):,} custom_id(s) would be written on two lines (the run's rows repeat them); "
            "no output written:\n  " + "\n  ".join(shown),
            hint="prepare the input again under a new --run: prepare now refuses repeated ids, naming both lines",
        )


def _rows(store: Store, layout: RunLayout) -> Iterator[tuple[str, str]]:
    """Every row's custom_id in the run, with where it is."""
    for entry in read_manifest(store, layout):
        with store.open(layout.chunk(entry.chunk)) as f:
            for number, raw in enumerate(f, 1):
                custom_id = json.loads(raw).get("custom_id")
                if isinstance(custom_id, str):
                    yield custom_id, f"chunk {entry.chunk} line {number}"
    try:
        errors = store.get(layout.prepare_errors).data.splitlines()
    except NotFound:
        errors = []
    for row in iter_jsonl(PrepareError, errors, layout.prepare_errors):
        if row.custom_id is not None:
            yield row.custom_id, f"set aside at prepare ({row.location}: {row.error})"
    try:
        reused = store.get(layout.reused_ids).data.splitlines()
    except NotFound:
        reused = []
    for number, raw in enumerate(reused, 1):
        yield json.loads(raw), f"reused row {number}"

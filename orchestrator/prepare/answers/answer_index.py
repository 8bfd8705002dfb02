"""A run's answer index: its answered rows' keys, sorted, in parts of the store; and the lookup of
a new input's keys against it, streaming one part at a time.

Format: `answers/<generation>/<n>.bin` hold fixed 26-byte records (key as two big-endian 64-bit
halves, then run number, chunk number and row, little-endian), sorted by key, each key once.
`answers/index.json` (records.AnswerIndex), written after every part of its generation, names
the parts with their first and last keys, row counts and SHA-256. So a crash while writing leaves
the old index.json (or none) naming whole parts only; a part that is changed, cut short or
missing is refused with an error naming it, never read as fewer or other answers.

Lookup (PartCursor): the new keys come in ascending slices (prepare/answers/reuse.py spills them by key
range and sorts one range at a time); each part is read, checked and matched against the keys of
a slice that fall in its key range (searchsorted), and only the last part read is kept: memory is
one slice plus one part, whatever the sizes of the input and the index.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import CorruptOutput, InputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import AnswerIndex, IndexPart, parse_record
from orchestrator.core.store import NotFound, Store
from orchestrator.prepare.answers.answer_keys import KEY_VERSION

if TYPE_CHECKING:
    import numpy.typing as npt

#: Records in one part: 1M records, 26 MB, one GET each (a billion rows: 954 parts, 26 GB).
PART_ROWS = 1 << 20


def record_dtype() -> Any:
    import numpy as np

    return np.dtype([("hi", ">u8"), ("lo", ">u8"), ("run", "<u2"), ("chunk", "<u4"), ("row", "<u4")])


def key_dtype() -> Any:
    import numpy as np

    return np.dtype([("hi", ">u8"), ("lo", ">u8")])


def keys_of(data: bytes) -> npt.NDArray[Any]:
    """16-byte keys (a chunk's keys file) as an array of (hi, lo)."""
    import numpy as np

    return np.frombuffer(data, dtype=key_dtype())


def run_number(runs: list[str], run: str) -> int:
    """`run`'s number in a list of runs (an index's, a reuse record's), added at the end if new."""
    if run not in runs:
        runs.append(run)
    return runs.index(run)


def sort_unique(records: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Records sorted by key, the first of each key kept (the same request asked twice)."""
    import numpy as np

    if len(records) == 0:
        return records
    order = np.lexsort((records["lo"], records["hi"]), axis=0)
    records = records[order]
    same = (records["hi"][1:] == records["hi"][:-1]) & (records["lo"][1:] == records["lo"][:-1])
    return records[np.concatenate(([True], ~same))]


def write_index(
    store: Store, layout: RunLayout, records: npt.NDArray[Any], runs: list[str], context: str, chunks_done: int
) -> AnswerIndex:
    """Parts of a new generation, then index.json naming them, then the old generations deleted."""
    # np.concatenate gives native byte order: the stored format is big-endian keys.
    records = sort_unique(records).astype(record_dtype())
    generation = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
    parts = []
    for n, start in enumerate(range(0, len(records), PART_ROWS)):
        chunk = records[start : start + PART_ROWS]
        data = chunk.tobytes()
        key = layout.answer_index_part(generation, n)
        store.put(key, data)
        parts.append(
            IndexPart(
                key=key,
                rows=len(chunk),
                first=_hex(chunk[0]),
                last=_hex(chunk[-1]),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
    index = AnswerIndex(
        version=KEY_VERSION,
        generation=generation,
        context=context,
        runs=runs,
        rows=len(records),
        parts=parts,
        chunks_done=chunks_done,
        created_at=time.time(),
    )
    store.put(layout.answer_index, index.to_bytes())
    keep = {p.key for p in parts} | {layout.answer_index}
    for info in list(store.list(layout.answer_index_prefix)):
        if info.key not in keep:
            store.delete(info.key)
    return index


def _hex(record: Any) -> str:
    return f"{int(record['hi']):016x}{int(record['lo']):016x}"


def read_index(store: Store, layout: RunLayout) -> AnswerIndex:
    """The run's index.json; a run without one, or a damaged one, is a user's error naming it."""
    try:
        data = store.get(layout.answer_index).data
    except NotFound:
        raise InputError(
            f"run {layout.run!r} has no answer index ({layout.answer_index})",
            hint=f"`orch collect --run {layout.run} --out FILE` writes it once the run has answers",
        ) from None
    index = parse_record(AnswerIndex, data, layout.answer_index)
    if index.version != KEY_VERSION:
        raise InputError(
            f"run {layout.run!r}: index keys are of version {index.version}, this orch makes {KEY_VERSION}",
            where=layout.answer_index,
            hint=f"`orch collect --run {layout.run} --out FILE` rewrites it (a run prepared by an older orch cannot)",
        )
    return index


def read_part(store: Store, layout: RunLayout, part: IndexPart) -> npt.NDArray[Any]:
    """One part, checked against index.json: bytes, size and SHA-256."""
    import numpy as np

    try:
        data = store.get(part.key).data
    except NotFound:
        raise _damaged(layout, part, "is missing") from None
    dtype = record_dtype()
    if len(data) != part.rows * dtype.itemsize:
        raise _damaged(layout, part, f"holds {len(data):,} bytes, not {part.rows:,} records")
    if hashlib.sha256(data).hexdigest() != part.sha256:
        raise _damaged(layout, part, "does not match the SHA-256 in index.json")
    return np.frombuffer(data, dtype=dtype)


def _damaged(layout: RunLayout, part: IndexPart, what: str) -> CorruptOutput:
    return CorruptOutput(
        f"run {layout.run!r}: the answer index part {part.key} {what}; no answer was reused from it",
        where=layout.answer_index,
        hint=f"`orch collect --run {layout.run} --out FILE` writes the index again",
    )


@dataclass
class Matches:
    """Which new keys were answered: their indices into the caller's key array, and where."""

    at: npt.NDArray[Any]  # int64 indices into the new keys
    run: npt.NDArray[Any]  # the answer's run number (into the index's runs)
    chunk: npt.NDArray[Any]
    row: npt.NDArray[Any]


class PartCursor:
    """One run's index, matched against slices of new keys that come in ascending key order: each
    part is read (and checked) when a slice first falls in its key range, and only the last part
    read is kept, since consecutive slices share at most that one."""

    def __init__(self, store: Store, layout: RunLayout, index: AnswerIndex):
        import numpy as np

        self.store, self.layout, self.index = store, layout, index
        self.firsts = np.array([int(p.first[:16], 16) for p in index.parts], dtype=np.uint64)
        self.lasts = np.array([int(p.last[:16], 16) for p in index.parts], dtype=np.uint64)
        self.kept: tuple[int, npt.NDArray[Any]] | None = None

    def match(self, hi: npt.NDArray[Any], lo: npt.NDArray[Any]) -> Matches:
        """The keys (uint64 halves, sorted by (hi, lo)) that the index holds: their indices, and where."""
        import numpy as np

        found: list[tuple[Any, ...]] = []
        if len(hi):
            # Parts whose key range meets [hi[0], hi[-1]]; a part's range is by its keys' first halves.
            low = int(np.searchsorted(self.lasts, hi[0], "left"))
            high = int(np.searchsorted(self.firsts, hi[-1], "right"))
            for n in range(low, high):
                start = np.searchsorted(hi, self.firsts[n], "left")
                stop = np.searchsorted(hi, self.lasts[n], "right")
                if start < stop:
                    at = np.arange(start, stop, dtype=np.int64)
                    found.append(_match(self._part(n), hi[start:stop], lo[start:stop], at))
        if not found:
            empty = np.zeros(0, dtype=np.int64)
            return Matches(empty, empty.astype(np.uint16), empty.astype(np.uint32), empty.astype(np.uint32))
        at, run, chunk, row = (np.concatenate(column) for column in zip(*found, strict=True))
        return Matches(at, run, chunk, row)

    def _part(self, n: int) -> npt.NDArray[Any]:
        if self.kept is None or self.kept[0] != n:
            self.kept = (n, read_part(self.store, self.layout, self.index.parts[n]))
        return self.kept[1]


def _match(
    records: npt.NDArray[Any], hi: npt.NDArray[Any], lo: npt.NDArray[Any], at: npt.NDArray[Any]
) -> tuple[Any, ...]:
    """The candidates whose (hi, lo) is a record of this sorted part."""
    import numpy as np

    part_hi, part_lo = records["hi"].astype(np.uint64), records["lo"].astype(np.uint64)
    left = np.searchsorted(part_hi, hi, "left")
    right = np.searchsorted(part_hi, hi, "right")
    hit = np.full(len(hi), -1, dtype=np.int64)
    single = right - left == 1
    same = single & (part_lo[np.minimum(left, len(part_lo) - 1)] == lo)
    hit[same] = left[same]
    for i in np.flatnonzero(right - left > 1):  # a 64-bit half shared by two keys: once in ~10^11 pairs
        spot = left[i] + np.searchsorted(part_lo[left[i] : right[i]], lo[i])
        if spot < right[i] and part_lo[spot] == lo[i]:
            hit[i] = spot
    ok = hit >= 0
    chosen = records[hit[ok]]
    return at[ok], chosen["run"], chosen["chunk"], chosen["row"]

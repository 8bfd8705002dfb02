"""Where a grouped chunk's rows sit in the input (`--group-by-prefix`): each chunk's positions file, checked.

Each file is checked before it is trusted: its SHA-256 against the manifest, one position per
row, and every position inside the input and given once. A damaged file would otherwise put
answers silently out of order (collect) or escalate the wrong rows (a cascade).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from orchestrator.core.errors import CorruptOutput
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ManifestEntry
from orchestrator.core.store import NotFound, Store


class InputPositions:
    """The input positions of grouped chunks' rows, each file checked as it is read: together the
    files must name every row of the chunks once, each at a distinct place in the input, and leave
    exactly the places of the rows set aside at prepare. A bit per input row is all it keeps."""

    def __init__(self, store: Store, layout: RunLayout, total: int):
        """`total`: every input row, set aside or not (positions run from 0 to total - 1)."""
        self.store, self.layout, self.total = store, layout, total
        self.seen = bytearray((total + 7) // 8)
        self.checked: list[ManifestEntry] = []

    def of(self, entry: ManifestEntry) -> list[int]:
        """The input position of each row of this chunk, in the chunk's order."""
        positions = self._load(entry)
        for row, position in enumerate(positions):
            if not 0 <= position < self.total:
                raise self._damaged(
                    entry, f"line {row + 1}: position {position} is outside the input's {self.total:,} rows"
                )
            if self._given(position):
                earlier = positions[:row]
                other = (
                    f"line {earlier.index(position) + 1}"
                    if position in earlier
                    else self.layout.chunk_positions(self._owner(position).chunk)
                )
                raise self._damaged(entry, f"line {row + 1}: position {position} is given by {other} too")
            self.seen[position >> 3] |= 1 << (position & 7)
        self.checked.append(entry)
        return positions

    def reserve(self, positions: Iterable[int]) -> None:
        """After every chunk: the places of rows answered by earlier runs (reuse), which no chunk may give."""
        for position in positions:
            if not 0 <= position < self.total or self._given(position):
                raise CorruptOutput(
                    f"reused row at input position {position} is outside the input or given by a chunk too",
                    where=self.layout.reused_sources,
                    hint=_HINT,
                )
            self.seen[position >> 3] |= 1 << (position & 7)

    def finish(self, set_aside: Iterable[int | None]) -> None:
        """After every chunk: no chunk row took the place of a row set aside at prepare (the
        counts then say every place is taken exactly once)."""
        for position in set_aside:
            if position is not None and 0 <= position < self.total and self._given(position):
                raise self._damaged(
                    self._owner(position), f"gives position {position}, the place of a row set aside at prepare"
                )

    def _load(self, entry: ManifestEntry) -> list[int]:
        try:
            data = self.store.get(self.layout.chunk_positions(entry.chunk)).data
        except NotFound:
            raise self._damaged(entry, "is missing") from None
        # Runs prepared before the checksum was recorded have none: the other checks still hold.
        if entry.positions_sha256 is not None and hashlib.sha256(data).hexdigest() != entry.positions_sha256:
            raise self._damaged(entry, "does not match the checksum in the manifest")
        try:
            positions = [int(p) for p in data.split()]
        except ValueError:
            raise self._damaged(entry, "holds something other than row positions") from None
        if len(positions) != entry.rows:
            raise self._damaged(entry, f"gives {len(positions):,} positions for the chunk's {entry.rows:,} rows")
        return positions

    def _given(self, position: int) -> bool:
        return bool(self.seen[position >> 3] >> (position & 7) & 1)

    def _owner(self, position: int) -> ManifestEntry:
        """The checked chunk whose positions file gave this position (read again: an error's rare path)."""
        return next(e for e in self.checked if position in self._load(e))

    def _damaged(self, entry: ManifestEntry, what: str) -> CorruptOutput:
        return CorruptOutput(
            f"the positions file of {entry.chunk} {what}: collect cannot restore input order",
            where=self.layout.chunk_positions(entry.chunk),
            hint=_HINT,
        )


_HINT = "prepare the input again under a new --run name"

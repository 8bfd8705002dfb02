"""Records spilled to local temporary files by partition, so that a pass over an input of any size
holds one partition at a time: the reuse lookup's new keys (by key range) and its matches (by the
answering run's chunk range).

Records are numpy structured arrays of one dtype; `add` buffers them and appends each partition's
share to its own file (opened per flush, so the number of partitions is not bounded by open file
handles); `take(p)` reads partition p back and deletes its file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy.typing as npt

#: Records buffered before they are appended to their partitions' files.
BUFFER_ROWS = 1 << 16


class Spill:
    """Partitioned temporary files of records of one dtype."""

    def __init__(self, dtype: Any, prefix: str):
        self.dtype = dtype
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.buffered: list[tuple[npt.NDArray[Any], npt.NDArray[Any]]] = []
        self.buffered_rows = 0
        self.partitions: set[int] = set()
        self.count = 0

    def add(self, records: npt.NDArray[Any], partition: npt.NDArray[Any]) -> None:
        """Records and the partition of each (non-negative integers)."""
        if len(records) == 0:
            return
        self.buffered.append((records, partition))
        self.buffered_rows += len(records)
        self.count += len(records)
        if self.buffered_rows >= BUFFER_ROWS:
            self.flush()

    def flush(self) -> None:
        import numpy as np

        if not self.buffered:
            return
        records = np.concatenate([r for r, _ in self.buffered]).astype(self.dtype)
        partition = np.concatenate([p for _, p in self.buffered])
        self.buffered, self.buffered_rows = [], 0
        order = np.argsort(partition, kind="stable")
        records, partition = records[order], partition[order]
        starts = np.flatnonzero(np.concatenate(([True], partition[1:] != partition[:-1])))
        for start, stop in zip(starts.tolist(), [*starts[1:].tolist(), len(partition)], strict=True):
            number = int(partition[start])
            with open(self._path(number), "ab") as f:
                f.write(records[start:stop].tobytes())
            self.partitions.add(number)

    def take(self, number: int) -> npt.NDArray[Any]:
        """Partition `number`'s records (in the order added), its file then deleted."""
        import numpy as np

        self.flush()
        if number not in self.partitions:
            return np.zeros(0, dtype=self.dtype)
        path = self._path(number)
        records = np.fromfile(path, dtype=self.dtype)
        os.unlink(path)
        self.partitions.discard(number)
        return records

    def _path(self, number: int) -> str:
        return os.path.join(self.dir, f"{number:08d}.bin")

    def discard(self) -> None:
        self.buffered = []
        shutil.rmtree(self.dir, ignore_errors=True)

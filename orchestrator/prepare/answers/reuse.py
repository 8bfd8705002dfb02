"""`orch prepare --reuse-from RUN`: input rows whose answer key another run answered go into no chunk.

1. A first pass over the input computes every good row's answer key (KeyCollector) and spills it,
   with the row's position, to local temporary files by key range (partitions of about
   PARTITION_ROWS rows).
2. Each partition in turn is sorted in memory and merged against each named run's answer index
   (answer_index.PartCursor: a part at a time), in the order named (the first run that answered a
   key gives its answer); rows that sample (temperature > 0, no seed) are left to run again unless
   `reuse.sampled` says otherwise. The result is a bit per input row (reused or not) and the
   matches, spilled by the answering run and chunk range (ReusePlan).
3. The second pass (prepare's usual one) writes only the other rows into chunks (ReusePlan.take
   says which), and the reused rows' custom_ids into reused/ids.jsonl.
4. reused/sources.bin (each reused row's key, input position and answer's run, chunk and row, in
   source order, so collect reads each source chunk once: the spilled ranges sorted one at a
   time) and reuse.json are written before the prepare record.

Memory: one partition (25 bytes a row), one index part (26 MB), and the bit per input row.
"""

from __future__ import annotations

import array
import hashlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import ReuseRecord, ReuseSource
from orchestrator.prepare.answers.answer_index import PartCursor, keys_of, read_index, run_number
from orchestrator.prepare.answers.answer_keys import AnswerKeys, PoolKeys
from orchestrator.prepare.formats import Request
from orchestrator.prepare.spill import BUFFER_ROWS, Spill

if TYPE_CHECKING:
    import numpy.typing as npt

#: New keys sorted in memory at once in step 2 (25 bytes each, about twice that while sorting).
PARTITION_ROWS = 1 << 21


def sources_dtype() -> Any:
    """A reused row in sources.bin: its key, input position, and its answer's run, chunk and row."""
    import numpy as np

    return np.dtype(
        [("hi", ">u8"), ("lo", ">u8"), ("position", "<u8"), ("run", "<u2"), ("chunk", "<u4"), ("row", "<u4")]
    )


def spilled_key_dtype() -> Any:
    """A new input row in step 1's spill: its key, input position and whether it samples."""
    import numpy as np

    return np.dtype([("hi", ">u8"), ("lo", ">u8"), ("position", "<i8"), ("sampled", "u1")])


class KeyCollector:
    """Step 1: every good row's key, input position and whether it samples, spilled by key range
    (the key's first bits) into partitions of about PARTITION_ROWS rows each. `total` counts input
    positions (a sweep's: rows x arms); PoolKeys key each row under its own model's context."""

    def __init__(self, keys: AnswerKeys | PoolKeys, total: int):
        self.answer_keys = keys
        # 2**bits partitions: total / 2**bits <= PARTITION_ROWS (keys are uniform: BLAKE2b).
        self.bits = min(((max(total, 1) - 1) // PARTITION_ROWS).bit_length(), 16)
        self.spill = Spill(spilled_key_dtype(), "orch-reuse-keys-")
        self.keys = bytearray()
        self.positions = array.array("q")
        self.sampled = bytearray()

    def before_row(self, position: int) -> None:
        """Nothing to do before a row (the first stage of the reuse plan's pass: conversion.RowStream)."""

    @property
    def count(self) -> int:
        return self.spill.count + len(self.positions)

    def add(self, request: Request, position: int) -> None:
        self.keys += self.answer_keys.of_request(request)
        self.positions.append(position)
        self.sampled.append(self.answer_keys.sampled(request))
        if len(self.positions) >= BUFFER_ROWS:
            self._flush()

    def _flush(self) -> None:
        import numpy as np

        records = np.zeros(len(self.positions), dtype=spilled_key_dtype())
        keys = keys_of(bytes(self.keys))
        records["hi"], records["lo"] = keys["hi"], keys["lo"]
        records["position"] = np.frombuffer(self.positions, dtype=np.int64)
        records["sampled"] = np.frombuffer(bytes(self.sampled), dtype=np.uint8)
        self.keys, self.positions, self.sampled = bytearray(), array.array("q"), bytearray()
        self.add_records(records)

    def add_records(self, records: npt.NDArray[Any]) -> None:
        """Rows already keyed (spilled_key_dtype), as `add` spills them in blocks."""
        self.spill.add(records, self._partition(records["hi"]))

    def _partition(self, hi: npt.NDArray[Any]) -> npt.NDArray[Any]:
        import numpy as np

        if self.bits == 0:
            return np.zeros(len(hi), dtype=np.int64)
        shifted: npt.NDArray[Any] = (hi.astype(np.uint64) >> np.uint64(64 - self.bits)).astype(np.int64)
        return shifted

    def sorted_partitions(self) -> Iterator[npt.NDArray[Any]]:
        """Each partition's records sorted by key (its first half), partitions in key order (each file then deleted)."""
        import numpy as np

        self._flush()
        for number in range(1 << self.bits):
            records = self.spill.take(number)
            # By the first half only: PartCursor needs no more (numpy sorts native integers fast,
            # big-endian fields slowly).
            yield records[np.argsort(records["hi"].astype(np.uint64))]

    def discard(self) -> None:
        self.spill.discard()


class ReusePlan:
    """Step 2's result: a bit per input row saying it is reused, and where the answers are (spilled
    by the answering run and chunk range, so step 4 sorts one range at a time)."""

    def __init__(self, total: int, runs: list[str], good: int):
        import numpy as np

        self.runs = runs
        self.good = good  # the input's good rows (reused or not)
        self.reused = np.zeros((total + 7) // 8, dtype=np.uint8)
        self.sources: list[ReuseSource] = []
        self.sampled_skipped = 0
        self.count = 0
        self.found = Spill(sources_dtype(), "orch-reused-sources-")
        fd, self.ids_path = tempfile.mkstemp(prefix="orch-reused-ids-", suffix=".jsonl")
        self.ids = os.fdopen(fd, "wb", buffering=1 << 20)

    def add(self, chosen: npt.NDArray[Any], chunks_per_bucket: int) -> None:
        """Reused rows (sources_dtype), noted in the bitmap and spilled by (run, chunk range)."""
        import numpy as np

        positions = chosen["position"].astype(np.int64)
        np.bitwise_or.at(self.reused, positions >> 3, np.left_shift(1, positions & 7).astype(np.uint8))
        self.count += len(chosen)
        bucket = chosen["run"].astype(np.int64) << 32 | chosen["chunk"].astype(np.int64) // chunks_per_bucket
        self.found.add(chosen, bucket)

    def take(self, request: Request, position: int) -> bool:
        """Step 3: True (and its custom_id noted) when this row is answered from an earlier run."""
        if int(self.reused[position >> 3]) >> (position & 7) & 1:
            self.ids.write(orjson.dumps(request.custom_id) + b"\n")
            return True
        return False

    def upload(self, ctx: RunContext) -> None:
        """Step 4: sources.bin in source order, a bucket at a time, then ids.jsonl and reuse.json."""
        import numpy as np

        self.ids.close()
        layout, store = ctx.layout, ctx.store
        self.found.flush()
        fd, sources_path = tempfile.mkstemp(prefix="orch-reused-sources-", suffix=".bin")
        sources_sha256 = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for bucket in sorted(self.found.partitions):
                    rows = self.found.take(bucket)
                    run_chunk = rows["run"].astype(np.uint64) << np.uint64(32) | rows["chunk"].astype(np.uint64)
                    data = rows[np.lexsort((rows["row"].astype(np.uint64), run_chunk))].tobytes()
                    sources_sha256.update(data)
                    out.write(data)
            store.put_file(layout.reused_sources, sources_path)
        finally:
            os.unlink(sources_path)
        store.put_file(layout.reused_ids, self.ids_path)
        record = ReuseRecord(
            runs=self.runs,
            sources=self.sources,
            rows=self.count,
            sampled_allowed=ctx.spec.reuse.sampled,
            sampled_skipped=self.sampled_skipped,
            sources_sha256=sources_sha256.hexdigest(),
            ids_sha256=_file_sha256(self.ids_path),
        )
        store.put(layout.reuse_record, record.to_bytes())

    def discard(self) -> None:
        if not self.ids.closed:
            self.ids.close()
        if os.path.exists(self.ids_path):
            os.unlink(self.ids_path)
        self.found.discard()


def _file_sha256(path: str) -> str:
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            sha256.update(block)
    return sha256.hexdigest()


def plan_reuse(ctx: RunContext, collected: KeyCollector, total: int) -> ReusePlan:
    """Step 2: the collected keys, a partition at a time in key order, looked up in each run of
    `reuse.from` (first run first), each run's index read a part at a time (PartCursor)."""
    if not collected.answer_keys.usable:
        raise InputError(
            "--reuse-from: the model is part of each answer's key, and this prepare names none",
            where="model.name",
            hint="name the model at prepare (--model), as the earlier run did",
        )
    plan = ReusePlan(total, [], collected.count)
    try:  # the plan's temporary files go with it on any error, a run without an index included
        runs = []
        for name in ctx.spec.reuse.runs:
            layout = _source_layout(ctx, name)
            index = read_index(ctx.store, layout)
            numbers = [run_number(plan.runs, run) for run in index.runs]
            # A bucket of sources.bin holds about PARTITION_ROWS rows (chunks of the index's mean size).
            per_bucket = max(1, PARTITION_ROWS * max(index.chunks_done, 1) // max(index.rows, 1))
            runs.append((PartCursor(ctx.store, layout, index), numbers, per_bucket))
        counts = [0] * len(runs)
        for records in collected.sorted_partitions():
            _plan_partition(ctx, plan, records, runs, counts)
    except BaseException:
        plan.discard()
        raise
    plan.sources = [ReuseSource(run=name, rows=n) for name, n in zip(ctx.spec.reuse.runs, counts, strict=True)]
    return plan


def _plan_partition(
    ctx: RunContext,
    plan: ReusePlan,
    records: npt.NDArray[Any],
    runs: list[tuple[PartCursor, list[int], int]],
    counts: list[int],
) -> None:
    """One key-sorted partition of the new keys against every run, the first run that answered a key winning."""
    import numpy as np

    hi, lo = records["hi"].astype(np.uint64), records["lo"].astype(np.uint64)
    sampled = records["sampled"].astype(bool)
    taken = np.zeros(len(records), dtype=bool)
    for n, (cursor, numbers, per_bucket) in enumerate(runs):
        found = cursor.match(hi, lo)
        fresh = ~taken[found.at]
        if not ctx.spec.reuse.sampled:
            plan.sampled_skipped += int(np.count_nonzero(fresh & sampled[found.at]))
            fresh &= ~sampled[found.at]
        at = found.at[fresh]
        taken[at] = True
        chosen = np.zeros(len(at), dtype=sources_dtype())
        chosen["hi"], chosen["lo"], chosen["position"] = hi[at], lo[at], records["position"][at]
        chosen["run"] = np.array(numbers, dtype=np.uint16)[found.run[fresh]] if numbers else 0
        chosen["chunk"], chosen["row"] = found.chunk[fresh], found.row[fresh]
        plan.add(chosen, per_bucket)
        counts[n] += len(at)


def _source_layout(ctx: RunContext, name: str) -> RunLayout:
    if name == ctx.layout.run:
        raise InputError(
            f"--reuse-from {name}: a run cannot reuse its own answers", hint="name an earlier run", where="reuse.from"
        )
    return RunLayout(name)

"""`orch prepare --reuse-from RUN`: input rows whose answer key another run answered go into no chunk.

1. A first pass over the input computes every good row's answer key (KeyCollector).
2. The keys are looked up in each named run's answer index, in the order named (the first run
   that answered a key gives its answer); rows that sample (temperature > 0, no seed) are left to
   run again unless `reuse.sampled` says otherwise.
3. The second pass (prepare's usual one) writes only the other rows into chunks (ReusePlan.take
   says which), and the reused rows' custom_ids into reused/ids.jsonl.
4. reused/sources.bin (each reused row's key, input position and answer's run, chunk and row, in
   source order, so collect reads each source chunk once) and reuse.json are written before the
   prepare record.
"""

from __future__ import annotations

import array
import hashlib
import os
import tempfile
from typing import TYPE_CHECKING, Any

import orjson

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import ReuseRecord, ReuseSource
from orchestrator.prepare.answer_index import keys_of, lookup, read_index, run_number
from orchestrator.prepare.answer_keys import AnswerKeys
from orchestrator.prepare.formats import Request

if TYPE_CHECKING:
    import numpy.typing as npt


def sources_dtype() -> Any:
    """A reused row in sources.bin: its key, input position, and its answer's run, chunk and row."""
    import numpy as np

    return np.dtype(
        [("hi", ">u8"), ("lo", ">u8"), ("position", "<u8"), ("run", "<u2"), ("chunk", "<u4"), ("row", "<u4")]
    )


class KeyCollector:
    """Step 1: every good row's key, input position and whether it samples."""

    def __init__(self, keys: AnswerKeys):
        self.answer_keys = keys
        self.keys = bytearray()
        self.positions = array.array("q")
        self.sampled = bytearray()

    def add(self, request: Request, position: int) -> None:
        self.keys += self.answer_keys.of_line(request.line)
        self.positions.append(position)
        self.sampled.append(self.answer_keys.sampled(request))

    @property
    def count(self) -> int:
        return len(self.positions)


class ReusePlan:
    """Step 2's result: the reused rows, by input position (ascending), and where their answers are."""

    def __init__(
        self, rows: npt.NDArray[Any], runs: list[str], sources: list[ReuseSource], sampled_skipped: int, good: int
    ):
        self.rows, self.runs, self.sources, self.sampled_skipped = rows, runs, sources, sampled_skipped
        self.good = good  # the input's good rows (reused or not)
        self.positions = rows["position"].tolist()
        self.next = 0
        fd, self.ids_path = tempfile.mkstemp(prefix="orch-reused-ids-", suffix=".jsonl")
        self.ids = os.fdopen(fd, "wb", buffering=1 << 20)

    @property
    def count(self) -> int:
        return len(self.positions)

    def take(self, request: Request, position: int) -> bool:
        """Step 3: True (and its custom_id noted) when this row is answered from an earlier run.
        Rows come in input order, as in step 1."""
        while self.next < len(self.positions) and self.positions[self.next] < position:
            self.next += 1
        if self.next < len(self.positions) and self.positions[self.next] == position:
            self.ids.write(orjson.dumps(request.custom_id) + b"\n")
            return True
        return False

    def upload(self, ctx: RunContext) -> None:
        """Step 4."""
        import numpy as np

        self.ids.close()
        layout, store = ctx.layout, ctx.store
        ordered = self.rows[np.lexsort((self.rows["row"], self.rows["chunk"], self.rows["run"]))]
        data = ordered.astype(sources_dtype()).tobytes()  # np.concatenate gave native byte order
        store.put(layout.reused_sources, data)
        store.put_file(layout.reused_ids, self.ids_path)
        ids_sha256 = hashlib.sha256()
        with open(self.ids_path, "rb") as f:
            while block := f.read(1 << 20):
                ids_sha256.update(block)
        record = ReuseRecord(
            runs=self.runs,
            sources=self.sources,
            rows=self.count,
            sampled_allowed=ctx.spec.reuse.sampled,
            sampled_skipped=self.sampled_skipped,
            sources_sha256=hashlib.sha256(data).hexdigest(),
            ids_sha256=ids_sha256.hexdigest(),
        )
        store.put(layout.reuse_record, record.to_bytes())

    def discard(self) -> None:
        if not self.ids.closed:
            self.ids.close()
        if os.path.exists(self.ids_path):
            os.unlink(self.ids_path)


def plan_reuse(ctx: RunContext, collected: KeyCollector) -> ReusePlan:
    """Step 2: the collected keys looked up in each run of `reuse.from`, first run first."""
    import numpy as np

    if not collected.answer_keys.usable:
        raise InputError(
            "--reuse-from: the model is part of each answer's key, and this prepare names none",
            where="model.name",
            hint="name the model at prepare (--model), as the earlier run did",
        )
    keys = keys_of(bytes(collected.keys))
    positions = np.frombuffer(collected.positions, dtype=np.int64)
    sampled = np.frombuffer(bytes(collected.sampled), dtype=np.uint8).astype(bool)
    taken = np.zeros(len(keys), dtype=bool)
    runs: list[str] = []
    sources: list[ReuseSource] = []
    rows: list[Any] = []
    skipped = 0
    for name in ctx.spec.reuse.runs:
        layout = _source_layout(ctx, name)
        index = read_index(ctx.store, layout)
        found = lookup(ctx.store, layout, index, keys)
        fresh = ~taken[found.at]
        if not ctx.spec.reuse.sampled:
            skipped += int(np.count_nonzero(fresh & sampled[found.at]))
            fresh &= ~sampled[found.at]
        at = found.at[fresh]
        taken[at] = True
        numbers = np.array([run_number(runs, run) for run in index.runs], dtype=np.uint16)
        chosen = np.zeros(len(at), dtype=sources_dtype())
        chosen["hi"], chosen["lo"], chosen["position"] = keys["hi"][at], keys["lo"][at], positions[at]
        chosen["run"] = numbers[found.run[fresh]] if len(numbers) else 0
        chosen["chunk"], chosen["row"] = found.chunk[fresh], found.row[fresh]
        rows.append(chosen)
        sources.append(ReuseSource(run=name, rows=len(at)))
    merged = np.concatenate(rows) if rows else np.zeros(0, dtype=sources_dtype())
    merged = merged[np.argsort(merged["position"], kind="stable")]
    return ReusePlan(merged, runs, sources, skipped, collected.count)


def _source_layout(ctx: RunContext, name: str) -> RunLayout:
    if name == ctx.layout.run:
        raise InputError(
            f"--reuse-from {name}: a run cannot reuse its own answers", hint="name an earlier run", where="reuse.from"
        )
    return RunLayout(name)

"""Prepare's stages after conversion: where a converted request goes on its way to a chunk.

Conversion (conversion.py) is the one place rows become requests: it reads each source row,
converts it (once per sweep arm), checks it as the workers would, routes it to its model's pool,
and hands each request with its input position to the first stage of a chain. The chain is
composed from the run's spec (pipeline.compose), each mode one stage:

- ReuseFilter (`--reuse-from`): drops the requests an earlier run answered (reuse.py's plan);
- an order and its chunks, the last stage:
  - StreamedChunks: input order, chunks cut at fixed input positions (a plain run: a bad row never
    shifts a boundary, and the same input gives byte-identical chunks);
  - PositionedChunks: input order, chunks cut every K rows kept, with each row's input position
    (rows reused leave holes a chunk of fixed positions would show);
  - SortedChunks: rows held in an external sort (by prompt prefix, `--group-by-prefix`; by model
    pool, several models or a sweep; or both), then cut into chunks of sorted rows.

Other passes over the input are chains of their own: the reuse plan's first pass keys every row
(reuse.KeyCollector), `--check` keeps nothing (NoChunks), and a repeated prepare finds the first
row that differs from the chunks it made (PreparedLines).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from orchestrator.core.context import RunContext
from orchestrator.core.spec import ChunkingSpec
from orchestrator.prepare.answers.reuse import ReusePlan
from orchestrator.prepare.conversion import RowStream
from orchestrator.prepare.formats import Request
from orchestrator.prepare.grouping import PrefixSorter
from orchestrator.prepare.pools import PoolSorters
from orchestrator.prepare.writers import ChunkWriter

Progress = Callable[[str], None]


class Chunker(RowStream, Protocol):
    """A chain that ends in chunk files."""

    def finish(self) -> ChunkWriter:
        """Every request written; the writer's close() uploads the chunks and gives their entries."""

    def discard(self) -> None:
        """Remove every temporary file, whatever happened."""


def chunk_boundaries(chunking: ChunkingSpec, total: int) -> list[int]:
    """Where chunks start in `total` rows (and the total last): `num_chunks` even chunks, else
    `rows_per_chunk` rows each, the last one shorter."""
    if total == 0:
        return [0]  # no chunk at all
    if chunking.num_chunks is not None:
        count = min(chunking.num_chunks, total)
        return [total * i // count for i in range(count + 1)]
    size = chunking.rows_per_chunk or 1
    return [min(i * size, total) for i in range(-(-total // size) + 1)]


class StreamedChunks:
    """A plain run: requests written as they come, chunks cut at input positions (bad rows never
    shift them). Nothing is uploaded before the whole input was read and checked (ChunkWriter)."""

    def __init__(self, ctx: RunContext, total: int):
        self.writer = ChunkWriter(ctx, chunk_boundaries(ctx.spec.chunking, total))
        self.total = total

    def add(self, request: Request, position: int) -> None:
        self.writer.add(request, position)

    def before_row(self, position: int) -> None:
        self.writer.advance_to(position)

    def finish(self) -> ChunkWriter:
        self.writer.advance_to(self.total)
        return self.writer

    def discard(self) -> None:
        self.writer.discard()


class PositionedChunks:
    """Input order with holes (rows reused): chunks of `rows_per_chunk` rows kept, each row with its
    input position, so collect puts every answer back in its place."""

    def __init__(self, ctx: RunContext, rows: int):
        self.writer = ChunkWriter(ctx, chunk_boundaries(ctx.spec.chunking, max(rows, 1)), positioned=True)

    def add(self, request: Request, position: int) -> None:
        self.writer.add_positioned(request, position)

    def before_row(self, position: int) -> None:
        pass

    def finish(self) -> ChunkWriter:
        return self.writer

    def discard(self) -> None:
        self.writer.discard()


class RowOrder(Protocol):
    """Requests held in an external sort, given back in order into a chunk writer."""

    @property
    def count(self) -> int: ...

    def add(self, request: Request, position: int) -> None: ...

    def boundaries(self) -> list[int]: ...

    def write(self, writer: ChunkWriter) -> None: ...

    def discard(self) -> None: ...


class PrefixOrder:
    """One model's requests by prompt prefix (`--group-by-prefix`), cut into chunks of the spec's size."""

    def __init__(self, chunking: ChunkingSpec):
        self.chunking = chunking
        self.sorter = PrefixSorter(chunking.prefix_chars)

    @property
    def count(self) -> int:
        return self.sorter.count

    def add(self, request: Request, position: int) -> None:
        self.sorter.add(request, position)

    def boundaries(self) -> list[int]:
        return chunk_boundaries(self.chunking, max(self.sorter.count, 1))

    def write(self, writer: ChunkWriter) -> None:
        writer.write_sorted(self.sorter.sorted_rows())

    def discard(self) -> None:
        self.sorter.discard()


class SortedChunks:
    """Requests held in a RowOrder until the input is read (and checked), then written in that order,
    chunks cut over the sorted rows, each chunk with its rows' input positions."""

    def __init__(self, ctx: RunContext, order: RowOrder, by_prefix: bool):
        self.ctx, self.order, self.by_prefix = ctx, order, by_prefix
        self.writer: ChunkWriter | None = None

    def add(self, request: Request, position: int) -> None:
        self.order.add(request, position)

    def before_row(self, position: int) -> None:
        pass

    def finish(self) -> ChunkWriter:
        self.writer = ChunkWriter(self.ctx, self.order.boundaries(), grouped=True, by_prefix=self.by_prefix)
        self.order.write(self.writer)
        return self.writer

    def discard(self) -> None:
        self.order.discard()
        if self.writer is not None:
            self.writer.discard()


class ReuseFilter:
    """`--reuse-from`: a request an earlier run answered goes into no chunk (reuse.ReusePlan.take
    records where its answer is); the others go on."""

    def __init__(self, reuse: ReusePlan, then: Chunker):
        self.reuse, self.then = reuse, then

    def add(self, request: Request, position: int) -> None:
        if not self.reuse.take(request, position):
            self.then.add(request, position)

    def before_row(self, position: int) -> None:
        self.then.before_row(position)

    def finish(self) -> ChunkWriter:
        return self.then.finish()

    def discard(self) -> None:
        self.then.discard()


class NoChunks:
    """`--check`: every request converted and checked, none kept."""

    def add(self, request: Request, position: int) -> None:
        pass

    def before_row(self, position: int) -> None:
        pass


class PreparedLines:
    """A repeated prepare of a plain run: each request against the line the run's chunks hold at its
    place, remembering the first that differs (`where` says which input row is being converted)."""

    def __init__(self, prepared: Iterator[bytes]):
        self.prepared = prepared
        #: The input row being converted, as `file:line` (set to Conversion.where).
        self.where: Callable[[], str] = lambda: "?"
        self.first: str | None = None

    def add(self, request: Request, _position: int) -> None:
        if self.first is not None:
            return
        then = next(self.prepared, None)
        if then is None:
            self.first = f"{self.where()}: a row the prepared run does not have"
        elif then != request.line:
            import orjson

            old_id = orjson.loads(then).get("custom_id")
            self.first = f"{self.where()} (custom_id {request.custom_id!r}; prepared: {old_id!r})"

    def before_row(self, position: int) -> None:
        pass

    def first_difference(self) -> str | None:
        """The first difference, or None when every line matched and none is left over."""
        if self.first is None and next(self.prepared, None) is not None:
            return "the prepared run has more rows than the input now"
        return self.first


def compose(ctx: RunContext, total: int, files: int, reuse: ReusePlan | None, progress: Progress) -> Chunker:
    """The chain a run's converted requests go through, from its spec: a reuse filter when it reuses,
    then the order its chunks hold them in. Says what it made (`files`: how many sources)."""
    spec = ctx.spec
    rows = f"{total:,} rows"
    chunker: Chunker
    if spec.models or spec.sweep.arms:
        pools = PoolSorters(list(spec.models) or [""], spec.chunking)
        arms = f" x {len(spec.sweep.arms)} arms" if spec.sweep.arms else ""
        progress(f"{rows}{arms} in {files} file(s), for {len(pools.order)} model(s)")
        if reuse is not None:
            progress(f"{reuse.good - reuse.count:,} requests to run")
        chunker = SortedChunks(ctx, pools, by_prefix=spec.chunking.group_by_prefix)
    elif reuse is not None:
        progress(f"{reuse.good - reuse.count:,} rows to run")
        chunker = (
            SortedChunks(ctx, PrefixOrder(spec.chunking), by_prefix=True)
            if spec.chunking.group_by_prefix
            else PositionedChunks(ctx, reuse.good - reuse.count)
        )
    elif spec.chunking.group_by_prefix:
        progress(f"{rows} in {files} file(s), grouped by prompt prefix")
        chunker = SortedChunks(ctx, PrefixOrder(spec.chunking), by_prefix=True)
    else:
        chunker = StreamedChunks(ctx, total)
        progress(f"{rows} in {files} file(s) -> {chunker.writer.total} chunks")
    return chunker if reuse is None else ReuseFilter(reuse, chunker)

"""`orch collect`: one output file in input order, with every custom_id checked to appear exactly once.

For every chunk, in manifest order:
1. Read its done marker: the only list of the chunk's outputs (a chunk without one is missing).
   Nothing reads a part the marker does not list.
2. Read each listed part, checking its SHA-256 against the marker (a mismatch stops everything:
   the store changed under the run, and a silently wrong output is the worst outcome).
3. Read the chunk's input, line by line, and put each output line in its input row's place (the
   line's id names its row). Each row must be answered once, by a line with the row's custom_id.
   Grouped by prefix, a row's place comes from its chunk's positions file, checked first against
   the manifest's checksum and for being a permutation (input_order.InputPositions).
4. Write the lines in input order, as OpenAI Batch lines (`--format openai`, a .jsonl's default) or
   as a table (collect_table.py, a .parquet's default); rows that failed or are missing go to the
   report, and their original request lines to the retry file, ready for `orch prepare --format openai-batch`.
5. Rows set aside at prepare are answered too, in their input place: an error line naming the
   input's file:line and the problem (code `invalid_request`), and their input lines in the
   retry file (as they were read: fixed, they prepare again in the run's input format).
Memory stays bounded by one chunk, plus 8 bytes a row for the check that no custom_id is written
twice (unique_ids.py). The output appears only when written whole (temp file, rename), and not at
all for an incomplete run unless partial output was asked for.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.collect.cascade import CascadeAnswers
from orchestrator.collect.comparison import ArmComparison
from orchestrator.collect.input_order import InputOrder, LineSink
from orchestrator.collect.parquet import flatten_lines, parquet_schema
from orchestrator.collect.report import CollectReport
from orchestrator.collect.reuse import AnswerIndexBuilder, ReusedAnswers
from orchestrator.collect.scratch import remove_leftovers
from orchestrator.collect.table import TableSpec, TableWriter, table_spec
from orchestrator.collect.unique_ids import WrittenIds
from orchestrator.core.errors import OutputError
from orchestrator.core.frozen_spec import read_stored_spec, run_schemas
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.records import (
    ManifestEntry,
    PrepareError,
    iter_jsonl,
    read_manifest,
)
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import NotFound, Store
from orchestrator.core.tempfiles import AtomicFile
from orchestrator.planning.pricing import GpuTable
from orchestrator.runview.chunk_answers import chunk_answers
from orchestrator.runview.positions import InputPositions

#: File name endings and the format each one means.
OUTPUT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
#: What the rows are: OpenAI Batch output lines (the wire format), or a table (collect_table.py).
SHAPES = ("openai", "table")


def output_shape(fmt: str | None, container: str) -> str:
    """--format openai|table, else a table for Parquet and the wire lines for JSONL (as before)."""
    if fmt in SHAPES:
        return fmt
    return "table" if container == "parquet" else "openai"


def output_format(out: str | os.PathLike[str], fmt: str | None) -> str:
    """The file format to write: --format jsonl|parquet, else the file name's ending (anything else
    is refused, never silently written as JSONL)."""
    if fmt and fmt not in SHAPES:
        return fmt
    for suffix, named in OUTPUT_SUFFIXES.items():
        if str(out).endswith(suffix):
            return named
    raise OutputError(
        f"{out}: orch writes {', '.join(OUTPUT_SUFFIXES)} files, not {Path(out).suffix or 'a name without an ending'}",
        hint="name the output .jsonl or .parquet (or say --format jsonl|parquet)",
    )


def check_output(out: str | os.PathLike[str], fmt: str | None = None) -> str:
    """Before any work: the output's format, and that its directory exists or can be made, and is
    writable. Returns the format."""
    fmt = output_format(out, fmt)
    directory = Path(out).absolute().parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Tried for real: permission bits say nothing to root, nor about read-only file systems.
        probe = AtomicFile(out)
        probe.discard()
        probe.close()
    except OSError as e:
        raise _unwritable(out, e) from None
    return fmt


def _unwritable(out: str | os.PathLike[str], e: OSError) -> OutputError:
    return OutputError(
        f"cannot write {out}: {e.strerror or e}", hint="choose another --out, or make its directory writable"
    )


def collect(
    store: Store,
    layout: RunLayout,
    out: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    retry_out: str | os.PathLike[str] | None = None,
    prices: GpuTable | None = None,
    default_spot: bool = True,
    partial: bool = True,
    keep_columns: list[str] | None = None,
    merge_on: str | None = None,
) -> CollectReport:
    """With `prices`, the report also says what the run's tokens cost (status's cost so far).
    Without `partial`, an incomplete run's output is not written (a pipeline that waits for the
    file must not take a failed collect for a finished one); the retry file still is: it lists
    the rows left to do. `keep_columns`: input columns a table carries. An Iceberg, Delta or Lance
    `out` gets the run's rows once (sinks.py), appended, or merged on the column `merge_on`.
    First, what killed collects left (in the temp dir, beside the output) is removed (scratch.py)."""
    from orchestrator.collect.sinks import collect_into_table, table_sink

    sink = table_sink(str(out))
    if merge_on is not None and sink is None:
        raise OutputError(
            f"--merge-on {merge_on}: {out} is a file, written whole: only a table is merged into",
            hint="--out delta:PATH, lance:PATH or iceberg://CATALOG/NS.TABLE (docs/tables.md)",
        )
    removed = remove_leftovers(None if sink is not None else out, retry_out)
    if sink is not None:
        again = functools.partial(collect, store, layout, fmt="table", retry_out=retry_out, prices=prices)
        into = functools.partial(again, default_spot=default_spot, partial=partial, keep_columns=keep_columns)
        report = collect_into_table(sink, str(out), layout.run, fmt, into, merge_on)
        report.leftovers_removed[:0] = removed
        return report
    container = check_output(out, fmt)
    shape = output_shape(fmt, container)
    if retry_out:
        check_output(retry_out, "jsonl")
    table = table_spec(store, layout, container, keep_columns) if shape == "table" else None
    comparison = ArmComparison.of(table or table_spec(store, layout, container, None))  # a sweep's arms
    entries = read_manifest(store, layout)
    report = CollectReport(
        out=str(out),
        format=container,
        shape=shape,
        chunks_total=len(entries),
        rows_total=sum(e.rows for e in entries),
        retry_out=str(retry_out) if retry_out else None,
        leftovers_removed=removed,
    )
    reuse = ReusedAnswers.load(store, layout)
    index = AnswerIndexBuilder(store, layout, reuse)
    cascade = CascadeAnswers.load(store, layout)  # a cascade's rows take their last stage's answer
    schemas = run_schemas(store, layout) if retry_out else None  # retried lines carry the run's schema whole
    with _Writer(out, container, table, cascade, comparison) as writer, _RetryWriter(retry_out, schemas) as retry:
        if any(e.positions for e in entries) or reuse is not None:
            _collect_in_input_order(store, layout, entries, writer, retry, report, reuse, index)
        else:
            set_aside = _SetAside(store, layout, writer, retry, report)
            for number, entry in enumerate(entries):
                answered = _collect_chunk(store, layout, entry, writer, retry, report, set_aside)
                index.add_chunk(number, answered, entry.model)
            set_aside.rest()
        for request_line in cascade.failed if cascade else []:  # a later stage's failed answer
            retry.add(request_line)
        writer.ids.check(store, layout)  # never two lines with one id: no output rather than that
        report.retry_rows = retry.count
        if not (partial or report.complete):
            writer.output.discard()
            report.out_written = False
    if cascade is not None:
        cascade.finish(report)
        for run in cascade.stage_runs:  # the later stages' answers are reusable too, under their models' keys
            index.add_run(RunLayout(run))
    index.write(report.chunks_complete)
    if prices is not None:
        _priced(report, store, layout, prices, default_spot, reuse, with_arms=comparison is not None)
    if comparison is not None:
        report.comparison = comparison.summary(report.arms)
    return report


def _priced(
    report: CollectReport,
    store: Store,
    layout: RunLayout,
    prices: GpuTable,
    default_spot: bool,
    reuse: ReusedAnswers | None,
    *,
    with_arms: bool,
) -> None:
    """What the run's tokens cost, as its status counts it (runview's narrow reads): per million
    tokens, each arm's share (a sweep), and what the reused rows saved."""
    from orchestrator.runview.status import cost_so_far, sweep_arms

    _, bought = cost_so_far(store, layout, prices=prices, default_spot=default_spot)
    report.cost_per_m_tokens = bought.model_dump()
    spec = _run_spec(store, layout) if with_arms else None
    if spec is not None:
        arms = sweep_arms(store, layout, spec, prices=prices, default_spot=default_spot)
        report.arms = {name: arm.model_dump() for name, arm in arms.items()}
    if reuse is not None:
        report.usd_saved = reuse.usd_saved(prices, default_spot)
        report.engine_s_saved = reuse.engine_s_saved()


def _run_spec(store: Store, layout: RunLayout) -> RunSpec | None:
    """The run's frozen spec, as a RunSpec (None for a run without one)."""
    found = read_stored_spec(store, layout)
    return RunSpec.model_validate({**found[0], "store": store.uri}) if found is not None else None


def _collect_in_input_order(
    store: Store,
    layout: RunLayout,
    entries: list[ManifestEntry],
    writer: _Writer,
    retry: _RetryWriter,
    report: CollectReport,
    reuse: ReusedAnswers | None,
    index: AnswerIndexBuilder,
) -> None:
    """Chunks with positions files (grouped by prefix, or prepared with reuse), the rows set aside and
    the reused rows, each line at its input position (input_order.InputOrder)."""
    with InputOrder(reuse.sink(writer.add) if reuse else writer.add) as ordered:
        set_aside = _SetAside(store, layout, ordered, retry, report)
        reused = reuse.record.rows if reuse else 0
        positions = InputPositions(store, layout, report.rows_total + set_aside.count + reused)
        for number, entry in enumerate(entries):
            answered = _collect_chunk(store, layout, entry, ordered, retry, report, set_aside, positions)
            index.add_chunk(number, answered, entry.model)
            ordered.end_run()
        if reuse is not None:
            reuse.place(ordered, positions, report)
        positions.finish(set_aside.positions())
        set_aside.rest()


def _collect_chunk(
    store: Store,
    layout: RunLayout,
    entry: ManifestEntry,
    writer: LineSink,
    retry: _RetryWriter,
    report: CollectReport,
    set_aside: _SetAside,
    input_positions: InputPositions | None = None,
) -> list[tuple[int, bytes]]:
    """The chunk's rows in their places; returns the rows answered without an error, with their requests."""
    answered: list[tuple[int, bytes]] = []
    answers = chunk_answers(store, layout, entry, report)
    if answers is None:
        report.missing_chunks.append(entry.chunk)
        answers = {}
    position = entry.first
    positions = input_positions.of(entry) if input_positions is not None and entry.positions else None
    for row, request_line, request in _input_rows(store, layout, entry):
        here = None  # the row's place in the input
        if positions is not None:  # grouped by prefix: the row's place is in its chunk's checked positions file
            here = positions[row] if row < len(positions) else None
        elif position is not None:  # rows set aside before this one take their places first
            here = set_aside.before(position)
            position = here + 1
        line = answers.pop(row) if row in answers else None
        if line is None:
            report.missing += 1
            report.note("missing", request.get("custom_id"))
            retry.add(request_line)
            continue
        if line.custom_id != request.get("custom_id"):
            report.mismatched += 1
            report.note("missing", request.get("custom_id"))
            retry.add(request_line)
            continue
        writer.add(line, here)
        report.rows_written += 1
        usage = line.usage()
        report.tokens.add(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
        if line.failed:
            report.errors += 1
            report.note("errors", line.custom_id)
            retry.add(request_line)
        else:
            answered.append((row, request_line))
    if answers:  # lines for rows the chunk does not have
        report.mismatched += len(answers)
    return answered


class _SetAside:
    """Step 5: the rows set aside at prepare (prepare-errors.jsonl, in input order), each answered
    with an error line at its input position, and its input line sent to the retry file."""

    def __init__(self, store: Store, layout: RunLayout, writer: LineSink, retry: _RetryWriter, report: CollectReport):
        self.writer, self.retry, self.report = writer, retry, report
        try:
            data = store.get(layout.prepare_errors).data
        except NotFound:
            data = b""
        self.data, self.key = data, layout.prepare_errors
        self.rows = iter_jsonl(PrepareError, data.splitlines(), layout.prepare_errors)
        self.count = sum(1 for line in data.splitlines() if line.strip())
        self.next = next(self.rows, None)

    def before(self, position: int) -> int:
        """Answer the set-aside rows before `position`, or at it (the next row then comes later);
        returns the position of the next row of the chunks."""
        while self.next is not None and self.next.position is not None and self.next.position <= position:
            if self.next.position == position:
                position += 1
            self._answer(self.next)
            self.next = next(self.rows, None)
        return position

    def positions(self) -> Iterator[int | None]:
        """The input position of each row set aside (None where an older prepare kept none)."""
        return (row.position for row in iter_jsonl(PrepareError, self.data.splitlines(), self.key))

    def rest(self) -> None:
        """Those after the last chunk's rows (or recorded without positions)."""
        while self.next is not None:
            self._answer(self.next)
            self.next = next(self.rows, None)

    def _answer(self, row: PrepareError) -> None:
        message = f"{row.location}: {row.error} (set aside at prepare)"
        line_id = f"batch_req_prepare-{row.position if row.position is not None else 0}"
        line = BatchOutputLine.error_row(row.custom_id, row.code or "invalid_request", message, line_id=line_id)
        self.writer.add(line, row.position)
        if row.line_bytes is None:  # a line over the size limit was never read: there is no line to retry
            self.retry.add(((row.text if row.text is not None else row.excerpt) + "\n").encode())
        r = self.report
        r.rows_total += 1
        r.rows_written += 1
        r.errors += 1
        r.set_aside += 1
        r.note("errors", row.custom_id or row.location)


def _input_rows(store: Store, layout: RunLayout, entry: ManifestEntry) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    with store.open(layout.chunk(entry.chunk)) as f:
        for row, raw in enumerate(f):
            try:
                request = json.loads(raw)
            except ValueError:
                request = {}
            yield row, raw if raw.endswith(b"\n") else raw + b"\n", request if isinstance(request, dict) else {}


class _Writer:
    """JSONL lines, or Parquet row groups (the part codec's columns plus a few flattened ones), or the
    table's rows, into a file that takes the output's name only when everything was written
    (core/tempfiles.AtomicFile)."""

    def __init__(
        self,
        out: str | os.PathLike[str],
        fmt: str,
        table: TableSpec | None,
        cascade: CascadeAnswers | None,
        comparison: ArmComparison | None,
    ):
        self.fmt, self.cascade, self.comparison = fmt, cascade, comparison
        self.output = _atomic(out)
        self.file = self.output.file
        self.rows: list[BatchOutputLine] = []
        self.parquet: Any = None  # a pyarrow ParquetWriter, opened at the first row group
        self.table = TableWriter(self.file, fmt, table) if table is not None else None
        self.ids = WrittenIds()

    def add(self, line: BatchOutputLine, position: int | None = None, *, reused: bool = False) -> None:
        self.ids.add(line.custom_id)
        final = None
        if self.cascade is not None:
            line, final = self.cascade.final(line)
        if self.comparison is not None:
            self.comparison.add(line)
        if self.table is not None:
            self.table.add(line, position, reused=reused, escalated=final.escalated if final else None)
        elif self.fmt == "jsonl":
            self.file.write(line.to_json() + b"\n")
        else:
            self.rows.append(line)
            if len(self.rows) >= 10_000:
                self._flush_parquet()

    def _flush_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.rows:
            return
        table = pa.table(flatten_lines(self.rows), schema=parquet_schema())
        if self.parquet is None:
            self.parquet = pq.ParquetWriter(self.file, table.schema, compression="zstd")
        self.parquet.write_table(table)
        self.rows = []

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        with _published(self.output):
            if exc_type is not None:
                self.output.discard()
            elif self.table is not None:
                self.table.finish()
            elif self.fmt == "parquet":
                self._flush_parquet()
                if self.parquet is None:  # no rows at all: still a valid, empty file
                    import pyarrow.parquet as pq

                    self.parquet = pq.ParquetWriter(self.file, parquet_schema())
                self.parquet.close()


class _RetryWriter:
    """The failed and missing requests, published like the output (AtomicFile): whole OpenAI Batch
    lines, a schema reference replaced by the run's schema (`schemas`)."""

    def __init__(self, path: str | os.PathLike[str] | None, schemas: RunSchemas | None = None):
        self.count = 0
        self.output = _atomic(path) if path else None
        self.schemas = schemas or RunSchemas()

    def add(self, request_line: bytes) -> None:
        self.count += 1
        if self.output:
            self.output.file.write(self.schemas.inflated_line(request_line))

    def __enter__(self) -> _RetryWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.output:
            with _published(self.output):
                if exc_type is not None:
                    self.output.discard()


def _atomic(path: str | os.PathLike[str]) -> AtomicFile:
    try:
        return AtomicFile(path)
    except OSError as e:
        raise _unwritable(path, e) from None


@contextmanager
def _published(output: AtomicFile) -> Iterator[None]:
    """Finish the file in the block, then rename it into place; any failure drops it, and an
    OSError (a full disk, a directory of that name) becomes a user's error naming the path."""
    try:
        with output:
            yield
    except OSError as e:
        raise _unwritable(output.path, e) from None

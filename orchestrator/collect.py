"""`orch collect`: one output file in input order, with every custom_id checked to appear exactly once.

For every chunk, in manifest order:
1. Read its done marker: the only list of the chunk's outputs (a chunk without one is missing).
   Nothing reads a part the marker does not list.
2. Read each listed part, checking its SHA-256 against the marker (a mismatch stops everything:
   the store changed under the run, and a silently wrong output is the worst outcome).
3. Read the chunk's input, line by line, and put each output line in its input row's place (the
   line's id names its row). Each row must be answered once, by a line with the row's custom_id.
4. Write the lines in input order; rows that failed or are missing go to the report, and their
   original request lines to the retry file, ready for `orch prepare --format openai-batch`.
Memory stays bounded by one chunk. The output appears only when complete (temp file, rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.core.errors import OrchError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import ManifestEntry, read_manifest, read_marker
from orchestrator.core.store import Store

EXAMPLES = 5


class CorruptOutput(OrchError):
    """A part's bytes do not match its done marker."""

    exit_code = 8


@dataclass
class CollectReport:
    out: str
    format: str
    chunks_total: int = 0
    chunks_complete: int = 0
    rows_total: int = 0
    rows_written: int = 0
    errors: int = 0
    missing: int = 0
    duplicates: int = 0
    mismatched: int = 0
    retry_out: str | None = None
    retry_rows: int = 0
    missing_chunks: list[str] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=lambda: {"missing": [], "duplicates": [], "errors": []})

    @property
    def complete(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.mismatched == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}

    def note(self, kind: str, custom_id: str | None) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(str(custom_id))


def output_format(out: str | os.PathLike, fmt: str | None) -> str:
    if fmt:
        return fmt
    return "parquet" if str(out).endswith(".parquet") else "jsonl"


def collect(
    store: Store,
    layout: RunLayout,
    out: str | os.PathLike,
    *,
    fmt: str | None = None,
    retry_out: str | os.PathLike | None = None,
) -> CollectReport:
    fmt = output_format(out, fmt)
    entries = read_manifest(store, layout)
    report = CollectReport(
        out=str(out),
        format=fmt,
        chunks_total=len(entries),
        rows_total=sum(e.rows for e in entries),
        retry_out=str(retry_out) if retry_out else None,
    )
    with _Writer(out, fmt) as writer, _RetryWriter(retry_out) as retry:
        for entry in entries:
            _collect_chunk(store, layout, entry, writer, retry, report)
        report.retry_rows = retry.count
    return report


def _collect_chunk(
    store: Store,
    layout: RunLayout,
    entry: ManifestEntry,
    writer: _Writer,
    retry: _RetryWriter,
    report: CollectReport,
) -> None:
    marker = read_marker(store, layout, entry.chunk)
    answers: dict[int, BatchOutputLine] = {}
    if marker is None:
        report.missing_chunks.append(entry.chunk)
    else:
        report.chunks_complete += 1
        for part in marker.parts:
            data = store.get(part.key).data
            if hashlib.sha256(data).hexdigest() != part.sha256:
                raise CorruptOutput(
                    f"{part.key} does not match the checksum in its done marker",
                    where=layout.done(entry.chunk),
                    hint="the store was changed outside orch; delete the marker and run the chunk again",
                )
            for part_line in iter_part_lines(data, marker.output_format):
                if part_line.row in answers:
                    report.duplicates += 1
                    report.note("duplicates", part_line.custom_id)
                    continue
                answers[part_line.row] = part_line
    for row, request_line, request in _input_rows(store, layout, entry):
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
        writer.add(line)
        report.rows_written += 1
        if line.failed:
            report.errors += 1
            report.note("errors", line.custom_id)
            retry.add(request_line)
    if answers:  # lines for rows the chunk does not have
        report.mismatched += len(answers)


def _input_rows(store: Store, layout: RunLayout, entry: ManifestEntry) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    with store.open(layout.chunk(entry.chunk)) as f:
        for row, raw in enumerate(f):
            try:
                request = json.loads(raw)
            except ValueError:
                request = {}
            yield row, raw if raw.endswith(b"\n") else raw + b"\n", request if isinstance(request, dict) else {}


class _Writer:
    """JSONL lines, or Parquet row groups (the part codec's columns plus a few flattened ones)."""

    def __init__(self, out: str | os.PathLike, fmt: str):
        self.out = Path(out)
        self.fmt = fmt
        self.out.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(dir=self.out.parent, prefix=f".{self.out.name}.")
        self.file = os.fdopen(fd, "wb")
        self.rows: list[BatchOutputLine] = []
        self.parquet: Any = None  # a pyarrow ParquetWriter, opened at the first row group

    def add(self, line: BatchOutputLine) -> None:
        if self.fmt == "jsonl":
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
        table = pa.table(_flatten(self.rows), schema=_parquet_schema())
        if self.parquet is None:
            self.parquet = pq.ParquetWriter(self.file, table.schema, compression="zstd")
        self.parquet.write_table(table)
        self.rows = []

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None and self.fmt == "parquet":
                self._flush_parquet()
                if self.parquet is None:  # no rows at all: still a valid, empty file
                    import pyarrow.parquet as pq

                    self.parquet = pq.ParquetWriter(self.file, _parquet_schema())
                self.parquet.close()
            self.file.close()
            if exc_type is None:
                os.replace(self.tmp, self.out)
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


class _RetryWriter:
    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self.count = 0
        self.file = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            self.file = os.fdopen(fd, "wb")

    def add(self, request_line: bytes) -> None:
        self.count += 1
        if self.file:
            self.file.write(request_line)

    def __enter__(self) -> _RetryWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.file and self.path:
            self.file.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
            elif os.path.exists(self.tmp):
                os.unlink(self.tmp)


def _parquet_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("custom_id", pa.string()),
            ("status_code", pa.int32()),
            ("text", pa.string()),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("error_code", pa.string()),
            ("error_message", pa.string()),
            ("id", pa.string()),
            ("response", pa.string()),
            ("error", pa.string()),
        ]
    )


def _flatten(lines: list[BatchOutputLine]) -> dict[str, list[Any]]:
    """The columns people query first, next to the full response and error as JSON text."""
    cols: dict[str, list[Any]] = {name: [] for name in _parquet_schema().names}
    for line in lines:
        body = line.response.body if line.response is not None else None
        usage = line.usage() if body and "usage" in body else None
        cols["custom_id"].append(line.custom_id)
        cols["status_code"].append(line.response.status_code if line.response is not None else None)
        cols["text"].append(line.text())
        cols["finish_reason"].append(line.first_choice().get("finish_reason"))
        cols["prompt_tokens"].append(usage.prompt_tokens if usage else None)
        cols["completion_tokens"].append(usage.completion_tokens if usage else None)
        cols["error_code"].append(line.error.code if line.error else None)
        cols["error_message"].append(line.error.message if line.error else None)
        cols["id"].append(line.id)
        cols["response"].append(line.response.model_dump_json() if line.response is not None else None)
        cols["error"].append(line.error.model_dump_json() if line.error else None)
    return cols

"""How a checkpointed part stores output lines (JSONL or Parquet), and how they are read back.

Each output line's `id` is `batch_req_<chunk>-<row>` (core/lines.py): unique per request, like
OpenAI's, and it tells resume which row of the chunk a line answers without reading the chunk's
input again. Parquet parts keep the OpenAI Batch line shape: `id` and `custom_id` columns, and
`response` and `error` as JSON text (nested bodies differ per request: logprobs, n > 1, errors).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from orchestrator.core.lines import BatchOutputLine, request_id
from orchestrator.core.protocol.checkpoints import RowStat

OUTPUT_FORMATS = ("jsonl", "parquet")


class AnsweredRow(Protocol):
    """An output row as the worker flushes it: the protocol's numbers, and the line itself."""

    @property
    def index(self) -> int: ...
    @property
    def error(self) -> bool: ...
    @property
    def tokens_in(self) -> int: ...
    @property
    def tokens_out(self) -> int: ...
    @property
    def tokens_cached(self) -> int: ...
    @property
    def line(self) -> BatchOutputLine: ...


def stat_of(line: BatchOutputLine) -> RowStat:
    usage = line.usage()
    return RowStat(
        index=line.row,
        error=line.failed,
        tokens_in=usage.prompt_tokens,
        tokens_out=usage.completion_tokens,
        tokens_cached=usage.cached_tokens,
    )


class JsonlPartCodec:
    ext = "jsonl"

    def __init__(self, chunk: str):
        self.chunk = chunk

    def encode(self, rows: Sequence[AnsweredRow]) -> bytes:
        return b"".join(_with_id(r, self.chunk).to_json() + b"\n" for r in rows)

    def decode(self, data: bytes) -> list[RowStat]:
        return [stat_of(line) for line in iter_part_lines(data, "jsonl")]


class ParquetPartCodec:
    ext = "parquet"

    def __init__(self, chunk: str):
        self.chunk = chunk

    def encode(self, rows: Sequence[AnsweredRow]) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        lines = [_with_id(r, self.chunk) for r in rows]
        table = pa.table(
            {
                "id": [line.id for line in lines],
                "custom_id": [line.custom_id for line in lines],
                "response": [line.response.model_dump_json() if line.response else None for line in lines],
                "error": [line.error.model_dump_json() if line.error else None for line in lines],
            },
            schema=_schema(),
        )
        out = io.BytesIO()
        pq.write_table(table, out, compression="zstd")
        return out.getvalue()

    def decode(self, data: bytes) -> list[RowStat]:
        return [stat_of(line) for line in iter_part_lines(data, "parquet")]


def iter_part_lines(data: bytes, fmt: str) -> Iterator[BatchOutputLine]:
    """The output lines of a part, whatever the part's format."""
    if fmt == "jsonl":
        for raw in data.splitlines():
            if raw.strip():
                yield BatchOutputLine.model_validate_json(raw)
        return
    import pyarrow.parquet as pq

    for row in pq.read_table(io.BytesIO(data)).to_pylist():
        yield BatchOutputLine(
            id=row["id"],
            custom_id=row["custom_id"],
            response=_json_or_none(row["response"]),
            error=_json_or_none(row["error"]),
        )


def part_codec(output_format: str, chunk: str) -> JsonlPartCodec | ParquetPartCodec:
    if output_format == "jsonl":
        return JsonlPartCodec(chunk)
    if output_format == "parquet":
        return ParquetPartCodec(chunk)
    raise ValueError(f"unknown output format {output_format!r}; expected one of {OUTPUT_FORMATS}")


def _with_id(row: AnsweredRow, chunk: str) -> BatchOutputLine:
    return row.line.model_copy(update={"id": request_id(chunk, row.index)})


def _json_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _schema() -> Any:  # built lazily: pyarrow is imported only when parquet is used
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("custom_id", pa.string()), ("response", pa.string()), ("error", pa.string())]
    )

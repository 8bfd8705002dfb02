"""How a checkpointed part stores output lines (JSONL or Parquet), and how they are read back.

Each output line's `id` is `batch_req_<chunk>-<row>`: unique per request, like OpenAI's, and it
tells resume which row of the chunk a line answers without reading the chunk's input again.
Parquet parts keep the OpenAI Batch line shape: `id` and `custom_id` columns, and `response` and
`error` as JSON text (nested bodies differ per request: logprobs, n > 1, errors).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from orchestrator.protocol.checkpoints import RowStat

OUTPUT_FORMATS = ("jsonl", "parquet")


class OutputLine(Protocol):
    index: int
    line: dict[str, Any]


def request_id(chunk: str, index: int) -> str:
    return f"batch_req_{chunk}-{index}"


def row_of(request_id_: str) -> int:
    return int(request_id_.rsplit("-", 1)[1])


def stat_of(line: dict[str, Any]) -> RowStat:
    usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
    return RowStat(
        index=row_of(line["id"]),
        error=line.get("error") is not None,
        tokens_in=int(usage.get("prompt_tokens") or 0),
        tokens_out=int(usage.get("completion_tokens") or 0),
    )


class JsonlPartCodec:
    ext = "jsonl"

    def __init__(self, chunk: str):
        self.chunk = chunk

    def encode(self, rows: Sequence[OutputLine]) -> bytes:
        return b"".join(
            json.dumps({**r.line, "id": request_id(self.chunk, r.index)}, ensure_ascii=False).encode() + b"\n"
            for r in rows
        )

    def decode(self, data: bytes) -> list[RowStat]:
        return [stat_of(line) for line in iter_part_lines(data, "jsonl")]


class ParquetPartCodec:
    ext = "parquet"

    def __init__(self, chunk: str):
        self.chunk = chunk

    def encode(self, rows: Sequence[OutputLine]) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "id": [request_id(self.chunk, r.index) for r in rows],
                "custom_id": [r.line.get("custom_id") for r in rows],
                "response": [_json_or_none(r.line.get("response")) for r in rows],
                "error": [_json_or_none(r.line.get("error")) for r in rows],
            },
            schema=_schema(),
        )
        out = io.BytesIO()
        pq.write_table(table, out, compression="zstd")
        return out.getvalue()

    def decode(self, data: bytes) -> list[RowStat]:
        return [stat_of(line) for line in iter_part_lines(data, "parquet")]


def iter_part_lines(data: bytes, fmt: str) -> Iterator[dict[str, Any]]:
    """The output lines of a part, in the OpenAI Batch output shape, whatever the part's format."""
    if fmt == "jsonl":
        for raw in data.splitlines():
            if raw.strip():
                yield json.loads(raw)
        return
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    for row in table.to_pylist():
        yield {
            "id": row["id"],
            "custom_id": row["custom_id"],
            "response": json.loads(row["response"]) if row["response"] is not None else None,
            "error": json.loads(row["error"]) if row["error"] is not None else None,
        }


def part_codec(output_format: str, chunk: str) -> JsonlPartCodec | ParquetPartCodec:
    if output_format == "jsonl":
        return JsonlPartCodec(chunk)
    if output_format == "parquet":
        return ParquetPartCodec(chunk)
    raise ValueError(f"unknown output format {output_format!r}; expected one of {OUTPUT_FORMATS}")


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _schema():  # built lazily: pyarrow is imported only when parquet is used
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("custom_id", pa.string()), ("response", pa.string()), ("error", pa.string())]
    )

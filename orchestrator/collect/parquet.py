"""collect's plain Parquet output (`--format parquet` of OpenAI lines): its schema and its columns."""

from __future__ import annotations

from typing import Any

from orchestrator.core.lines import BatchOutputLine


def parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("custom_id", pa.string()),
            ("status_code", pa.int32()),
            ("text", pa.string()),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("embeddings", pa.list_(pa.list_(pa.float32()))),  # one vector per input of an embeddings line
            ("error_code", pa.string()),
            ("error_message", pa.string()),
            ("id", pa.string()),
            ("response", pa.string()),
            ("error", pa.string()),
        ]
    )


def flatten_lines(lines: list[BatchOutputLine]) -> dict[str, list[Any]]:
    """The columns people query first, next to the full response and error as JSON text."""
    cols: dict[str, list[Any]] = {name: [] for name in parquet_schema().names}
    for line in lines:
        body = line.response.body if line.response is not None else None
        usage = line.usage() if body and "usage" in body else None
        cols["custom_id"].append(line.custom_id)
        cols["status_code"].append(line.response.status_code if line.response is not None else None)
        cols["text"].append(line.text())
        cols["finish_reason"].append(line.first_choice().get("finish_reason"))
        cols["prompt_tokens"].append(usage.prompt_tokens if usage else None)
        cols["completion_tokens"].append(usage.completion_tokens if usage else None)
        cols["embeddings"].append(line.embeddings())
        cols["error_code"].append(line.error.code if line.error else None)
        cols["error_message"].append(line.error.message if line.error else None)
        cols["id"].append(line.id)
        cols["response"].append(line.response.model_dump_json() if line.response is not None else None)
        cols["error"].append(line.error.model_dump_json() if line.error else None)
    return cols

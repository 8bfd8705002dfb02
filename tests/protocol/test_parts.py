"""Part codecs: output lines survive a round trip through JSONL and Parquet, and resume reads their rows."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.core.lines import BatchError, BatchOutputLine, BatchResponse, request_id, row_of
from orchestrator.core.protocol.parts import iter_part_lines, part_codec


@dataclass
class Out:
    index: int
    line: BatchOutputLine
    error: bool = False
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0


def ok_line(cid: str, text: str) -> BatchOutputLine:
    body = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "total_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    return BatchOutputLine(custom_id=cid, response=BatchResponse(status_code=200, request_id="r", body=body))


def err_line(cid: str) -> BatchOutputLine:
    return BatchOutputLine(
        custom_id=cid,
        response=BatchResponse(status_code=400, request_id="r"),
        error=BatchError(code="context_length_exceeded", message="too long"),
    )


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_part_codec_round_trips_lines_and_row_stats(fmt):
    codec = part_codec(fmt, "part_00007")
    rows = [Out(5, ok_line("a", "héllo")), Out(9, err_line("b")), Out(0, ok_line("c", "x"))]
    data = codec.encode(rows)
    stats = codec.decode(data)
    assert [(s.index, s.error, s.tokens_in, s.tokens_out, s.tokens_cached) for s in stats] == [
        (5, False, 7, 3, 4),
        (9, True, 0, 0, 0),
        (0, False, 7, 3, 4),
    ]
    lines = list(iter_part_lines(data, fmt))
    assert [line.custom_id for line in lines] == ["a", "b", "c"]
    assert lines[0].text() == "héllo"
    assert lines[1].error is not None and lines[1].error.code == "context_length_exceeded"
    assert lines[0].id == request_id("part_00007", 5)


def test_request_id_names_chunk_and_row():
    assert row_of(request_id("part_00042", 1234)) == 1234


def test_part_codec_rejects_unknown_format():
    with pytest.raises(ValueError, match="unknown output format"):
        part_codec("csv", "c")

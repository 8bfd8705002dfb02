"""Small runs from tables and Parquet files, answered without an engine (tests/test_tables.py, tests/test_tables_s3.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import read_manifest
from orchestrator.core.store import open_store
from tests.support.runs import Answer, answer_chunk


def rows(start: int, count: int) -> pa.Table:
    """Rows `r<start>`... with a question and a number each."""
    ids = range(start, start + count)
    return pa.table({"id": [f"r{i}" for i in ids], "question": [f"question {i}" for i in ids], "n": list(ids)})


def prepare(store: str, run: str, source: str, *extra: str) -> int:
    """`orch prepare` of a table or file of `rows`: the question is the text, `id` the id."""
    flags = ["--format", "text", "--text-column", "question", "--id-column", "id", "--model", "m"]
    return main(["prepare", "--run", run, "--store", store, *flags, *extra, source])


def chunk_lines(store: str, run: str) -> list[dict[str, Any]]:
    """The run's request lines, chunk after chunk."""
    s, layout = open_store(store), RunLayout(run)
    return [
        json.loads(line) for e in read_manifest(s, layout) for line in s.get(layout.chunk(e.chunk)).data.splitlines()
    ]


def answer_all(store: str, run: str) -> None:
    """Every row answered `answer <custom_id>`, through the worker protocol's own objects."""
    s, layout = open_store(store), RunLayout(run)
    for entry in read_manifest(s, layout):
        ids = [json.loads(line)["custom_id"] for line in s.get(layout.chunk(entry.chunk)).data.splitlines()]
        answer_chunk(s, layout, entry.chunk, [[Answer(i, cid, f"answer {cid}") for i, cid in enumerate(ids)]])


def answer_by_question(store: str, run: str) -> None:
    """Every row answered with its question: an edited question gets another answer."""
    s, layout = open_store(store), RunLayout(run)
    for entry in read_manifest(s, layout):
        requests = [json.loads(line) for line in s.get(layout.chunk(entry.chunk)).data.splitlines()]
        answers = [
            Answer(i, r["custom_id"], f"answer to {r['body']['messages'][-1]['content']}")
            for i, r in enumerate(requests)
        ]
        answer_chunk(s, layout, entry.chunk, [answers])


def answered_run(tmp_path: Path, run: str, count: int) -> str:
    """A run prepared from a Parquet file of `count` rows (r0, r1, ...), every row answered; its store."""
    pq.write_table(rows(0, count), tmp_path / f"{run}.parquet")
    store = str(tmp_path / "store")
    assert prepare(store, run, str(tmp_path / f"{run}.parquet")) == 0
    answer_all(store, run)
    return store

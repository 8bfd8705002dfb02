"""Tables of each kind (Iceberg on a SQL catalog, Delta Lake, Lance, Hugging Face datasets) written through
their own libraries, and small runs prepared from them and answered without an engine."""

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


class Tables:
    """A table of each kind under one folder, created and appended to through its own library."""

    def __init__(self, root: Path):
        self.root = root
        (root / "wh").mkdir(exist_ok=True)
        self.query = f"type=sql&uri=sqlite:///{root}/catalog.db&warehouse=file://{root}/wh"

    def uri(self, kind: str, version: Any = None) -> str:
        at = f"@{version}" if version is not None else ""
        return {
            "iceberg": f"iceberg://local/db.q{at}?{self.query}",
            "delta": f"{self.root}/delta_q{at}",
            "lance": f"lance:{self.root}/q.lance{at}",
            "hf": f"{self.root}/hf_q",
        }[kind]

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(
            "local", type="sql", uri=f"sqlite:///{self.root}/catalog.db", warehouse=f"file://{self.root}/wh"
        )

    def write(self, kind: str, table: pa.Table, **options: Any) -> str:
        """Create or append; the new snapshot's id or version."""
        if kind == "iceberg":
            catalog = self.catalog()
            catalog.create_namespace_if_not_exists("db")
            if not catalog.table_exists("db.q"):
                catalog.create_table("db.q", schema=table.schema)
            iceberg = catalog.load_table("db.q")
            iceberg.append(table)
            return str(iceberg.current_snapshot().snapshot_id)
        if kind == "delta":
            from deltalake import DeltaTable, write_deltalake

            write_deltalake(str(self.root / "delta_q"), table, mode="append", **options)
            return str(DeltaTable(str(self.root / "delta_q")).version())
        if kind == "lance":
            import lance

            path = self.root / "q.lance"
            return str(lance.write_dataset(table, str(path), mode="append" if path.exists() else "create").version)
        import datasets

        datasets.Dataset(table).save_to_disk(str(self.root / "hf_q"))
        return "0"


def prepare_table(store: str, run: str, source: str, *extra: str) -> int:
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
    assert prepare_table(store, run, str(tmp_path / f"{run}.parquet")) == 0
    answer_all(store, run)
    return store

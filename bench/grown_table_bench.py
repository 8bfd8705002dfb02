"""A grown Delta table read again with --reuse-from: rows keyed and prepare time, incremental vs whole.

`python -m bench.grown_table_bench [ROWS] [--quick]`: a Delta table of ROWS rows (default 200,000;
--quick 20,000) is prepared and every row answered without an engine
(tests.support.runs.answer_chunk), collected (its answer index); the table grows by 10%;
`orch prepare --reuse-from` is timed twice on the grown table: as shipped (pass 1 reads and keys
only the appended rows, prepare/grown.py) and with the incremental path turned off (the whole
table read and keyed). Prints both, and the rows each pass 1 keyed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import pyarrow as pa

from bench.common import sized


def _rows(start: int, count: int) -> pa.Table:
    ids = range(start, start + count)
    return pa.table({"id": [f"r{i}" for i in ids], "question": [f"question number {i}" for i in ids]})


def _prepare(store: str, run: str, table: str, *extra: str) -> tuple[float, str]:
    from orchestrator.cli import main

    flags = ["--format", "text", "--text-column", "question", "--id-column", "id", "--model", "m"]
    said = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(said):
        assert (
            main(["prepare", "--run", run, "--store", store, *flags, "--rows-per-chunk", "50000", *extra, table]) == 0
        )
    return time.perf_counter() - started, said.getvalue()


def main(rows: int) -> None:
    from deltalake import write_deltalake

    from orchestrator.cli import main as orch
    from orchestrator.core.layout import RunLayout
    from orchestrator.core.records import read_manifest
    from orchestrator.core.store import open_store
    from tests.support.runs import Answer, answer_chunk

    root = Path(tempfile.mkdtemp(prefix="grown-bench-"))
    (root / "orch.yaml").write_text("sampling:\n  temperature: 0\n")
    os.chdir(root)
    table, store = str(root / "t"), str(root / "store")
    write_deltalake(table, _rows(0, rows))
    _prepare(store, "a", table)
    s, layout = open_store(store), RunLayout("a")
    for entry in read_manifest(s, layout):
        ids = [json.loads(line)["custom_id"] for line in s.get(layout.chunk(entry.chunk)).data.splitlines()]
        answer_chunk(s, layout, entry.chunk, [[Answer(i, c, f"answer {c}") for i, c in enumerate(ids)]])
    with contextlib.redirect_stdout(io.StringIO()):
        assert orch(["collect", "--run", "a", "--store", store, "--out", str(root / "a.jsonl")]) == 0
    write_deltalake(table, _rows(rows, rows // 10), mode="append")
    incremental, said = _prepare(store, "b", table, "--reuse-from", "a")
    assert "appended rows" in said, said
    with mock.patch("orchestrator.prepare.pipeline.grown_table", return_value=(None, "")):
        whole, said = _prepare(store, "c", table, "--reuse-from", "a")
    total = rows + rows // 10
    print(f"rows {total:,} ({rows:,} + {rows // 10:,} appended)")
    print(f"incremental: keyed {rows // 10:,} rows, prepare {incremental:.2f} s")
    print(f"whole:       keyed {total:,} rows, prepare {whole:.2f} s  ratio {incremental / whole:.2f}x")


if __name__ == "__main__":
    given = [a for a in sys.argv[1:] if not a.startswith("-")]
    main(int(given[0]) if given else sized(200_000, 20_000, 500))

"""Table sources vs the Parquet source: rows/s of Iceberg, Delta, Lance and a saved HF dataset on the same rows.

200,000 rows (id, a 20-80 word question, two columns prepare does not need) are written once as
a Parquet file and as a table of each kind. Measured for each source, best of 3 rounds taken in
turn: `read` (resolve, count, and stream the rows prepare reads as RawRows: what a source
costs) and `prepare` (`orch prepare --format text` end to end, chunks written to a local store).
Target: every table source >= 0.8x the Parquet source's rows/s.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import save, table


def dataset(rows: int) -> Any:
    import pyarrow as pa

    rng = random.Random(7)
    words = [f"w{i}" for i in range(5000)]
    return pa.table(
        {
            "id": [f"row-{i}" for i in range(rows)],
            "question": [" ".join(rng.choices(words, k=rng.randint(20, 80))) for _ in range(rows)],
            "score": [rng.random() for _ in range(rows)],
            "notes": ["x" * rng.randint(0, 200) for _ in range(rows)],
        }
    )


def write_sources(root: Path, data: Any) -> dict[str, str]:
    import datasets
    import deltalake
    import lance
    import pyarrow.parquet as pq
    from pyiceberg.catalog import load_catalog

    pq.write_table(data, root / "rows.parquet")
    (root / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{root}/c.db", "warehouse": f"file://{root}/wh"}
    catalog = load_catalog("bench", **props)
    catalog.create_namespace("db")
    catalog.create_table("db.rows", schema=data.schema).append(data)
    deltalake.write_deltalake(str(root / "delta"), data)
    lance.write_dataset(data, str(root / "rows.lance"))
    datasets.Dataset(data).save_to_disk(str(root / "hf"))
    query = "&".join(f"{k}={v}" for k, v in props.items())
    return {
        "parquet": str(root / "rows.parquet"),
        "iceberg": f"iceberg://bench/db.rows?{query}",
        "delta": f"delta:{root}/delta",
        "lance": f"lance:{root}/rows.lance",
        "hf": f"hf:{root}/hf",
    }


def read_seconds(uri: str) -> tuple[float, int]:
    from orchestrator.prepare.sources import count_rows, iter_rows, resolve_sources

    started = time.perf_counter()
    (source,) = resolve_sources([uri])
    count_rows(source)
    rows = sum(1 for _ in iter_rows(source, ["id", "question"]))
    return time.perf_counter() - started, rows


def prepare_seconds(uri: str, store: Path, run: str) -> tuple[float, int]:
    from orchestrator.cli import main

    out = io.StringIO()
    flags = ["--format", "text", "--text-column", "question", "--id-column", "id", "--model", "m"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["prepare", "--run", run, "--store", str(store), *flags, "--num-chunks", "20", "--json", uri])
    assert code == 0, out.getvalue()
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    return float(report["seconds"]), int(report["rows"])


def main() -> None:
    rows = 20_000 if "--quick" in sys.argv else 200_000
    root = Path(tempfile.mkdtemp(prefix="orch-table-bench-"))
    try:
        sources = write_sources(root, dataset(rows))
        best: dict[str, dict[str, float]] = {name: {"read": 1e9, "prepare": 1e9} for name in sources}
        for round_ in range(3):
            for name, uri in sources.items():
                seconds, got = read_seconds(uri)
                assert got == rows, (name, got)
                best[name]["read"] = min(best[name]["read"], seconds)
                seconds, got = prepare_seconds(uri, root / "store", f"{name}-{round_}")
                assert got == rows, (name, got)
                best[name]["prepare"] = min(best[name]["prepare"], seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = best["parquet"]
    result: dict[str, Any] = {"rows": rows, "sources": {}}
    lines = []
    for name, seconds in best.items():
        read, prep = rows / seconds["read"], rows / seconds["prepare"]
        ratios = {"read_ratio": base["read"] / seconds["read"], "prepare_ratio": base["prepare"] / seconds["prepare"]}
        result["sources"][name] = {"read_rows_per_s": round(read), "prepare_rows_per_s": round(prep), **ratios}
        lines.append(
            [name, f"{read:,.0f}", f"{ratios['read_ratio']:.2f}x", f"{prep:,.0f}", f"{ratios['prepare_ratio']:.2f}x"]
        )
    print(table(lines, ["source", "read rows/s", "vs parquet", "prepare rows/s", "vs parquet"]))
    result["met"] = all(min(s["read_ratio"], s["prepare_ratio"]) >= 0.8 for s in result["sources"].values())
    print(f"target >= 0.8x the Parquet source: {'met' if result['met'] else 'NOT met'}")
    save("table_sources_bench", result)


if __name__ == "__main__":
    main()

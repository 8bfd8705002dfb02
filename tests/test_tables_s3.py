"""Table sources and sinks on the S3 test server (SeaweedFS): Iceberg (SQL catalog, s3:// warehouse), Delta Lake, Lance.

Each table is written through its own library, read by `orch prepare` and written by `orch collect
--out`, with the endpoint given the way a user gives it: AWS_ENDPOINT_URL in the environment.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from tests.support.tables import answered_run, chunk_lines, prepare_table, rows

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")]
KINDS = ["iceberg", "delta", "lance"]


class S3Tables:
    """Tables of each kind under one fresh prefix of the server's bucket, written through their libraries."""

    def __init__(self, root: Path, bucket: str, endpoint: str):
        self.endpoint = endpoint
        self.prefix = f"s3://{bucket}/t-{uuid.uuid4().hex[:10]}"
        self.catalog_props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"{self.prefix}/wh"}

    def uri(self, kind: str, name: str) -> str:
        if kind == "iceberg":
            return f"iceberg://lake/db.{name}?" + "&".join(f"{k}={v}" for k, v in self.catalog_props.items())
        return f"{kind}:{self.prefix}/{name}" + (".lance" if kind == "lance" else "")

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("lake", **self.catalog_props, **{"s3.endpoint": self.endpoint, "s3.region": "us-east-1"})

    def write(self, kind: str, name: str, table: pa.Table) -> None:
        location = self.uri(kind, name).split(":", 1)[1]
        if kind == "iceberg":
            catalog = self.catalog()
            catalog.create_namespace_if_not_exists("db")
            catalog.create_table(f"db.{name}", schema=table.schema).append(table)
        elif kind == "delta":
            from deltalake import write_deltalake

            write_deltalake(location, table, storage_options={"AWS_ALLOW_HTTP": "true"})
        else:
            import lance

            lance.write_dataset(table, location, storage_options={"allow_http": "true"})

    def read(self, kind: str, name: str) -> pa.Table:
        location = self.uri(kind, name).split(":", 1)[1]
        if kind == "iceberg":
            return self.catalog().load_table(f"db.{name}").scan().to_arrow()
        if kind == "delta":
            from deltalake import DeltaTable

            return DeltaTable(location, storage_options={"AWS_ALLOW_HTTP": "true"}).to_pyarrow_table()
        import lance

        return lance.dataset(location, storage_options={"allow_http": "true"}).to_table()


@pytest.fixture
def s3_tables(seaweedfs_server, seaweedfs_bucket, tmp_path, monkeypatch) -> S3Tables:
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs_server.endpoint)
    monkeypatch.delenv("ORCH_S3_ENDPOINT_URL", raising=False)
    return S3Tables(tmp_path, seaweedfs_bucket, seaweedfs_server.endpoint)


@pytest.mark.parametrize("kind", KINDS)
def test_table_source_on_s3_gives_the_parquet_files_requests(kind, s3_tables, tmp_path, capsys):
    data = rows(0, 20)
    s3_tables.write(kind, "q", data)
    pq.write_table(data, tmp_path / "same.parquet")
    store = str(tmp_path / "store")
    assert prepare_table(store, "p", str(tmp_path / "same.parquet")) == 0
    assert prepare_table(store, "t", s3_tables.uri(kind, "q"), "--rows-per-chunk", "6") == 0, capsys.readouterr().err
    assert chunk_lines(store, "t") == chunk_lines(store, "p")
    capsys.readouterr()
    assert prepare_table(store, "t", s3_tables.uri(kind, "q"), "--rows-per-chunk", "6") == 0
    assert "already prepared" in capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS)
def test_collect_into_table_on_s3_appends_a_run_once(kind, s3_tables, tmp_path, capsys):
    store = answered_run(tmp_path, "c", 9)
    out = s3_tables.uri(kind, "answers")
    assert main(["collect", "--run", "c", "--store", store, "--out", out]) == 0, capsys.readouterr().err
    assert f"appended to {out} at " in capsys.readouterr().out
    written = s3_tables.read(kind, "answers").to_pydict()
    assert written["id"] == [f"r{i}" for i in range(9)]
    assert written["text"] == [f"answer r{i}" for i in range(9)]
    assert main(["collect", "--run", "c", "--store", store, "--out", out]) == 0
    assert f"already in {out} at " in capsys.readouterr().out
    assert s3_tables.read(kind, "answers").num_rows == 9  # collecting twice never writes the rows twice


@pytest.mark.parametrize("kind", KINDS)
def test_collect_merge_on_into_table_on_s3_keeps_one_row_per_id(kind, s3_tables, tmp_path, capsys):
    out = s3_tables.uri(kind, "merged")
    first = answered_run(tmp_path, "c", 9)
    assert main(["collect", "--run", "c", "--store", first, "--out", out, "--merge-on", "id"]) == 0
    grown = answered_run(tmp_path, "d", 12)  # the same 9 ids and 3 more
    capsys.readouterr()
    assert main(["collect", "--run", "d", "--store", grown, "--out", out, "--merge-on", "id"]) == 0
    assert f"merged into {out} on id at " in capsys.readouterr().out
    written = s3_tables.read(kind, "merged").to_pydict()
    assert sorted(written["id"], key=lambda i: int(i[1:])) == [f"r{i}" for i in range(12)]

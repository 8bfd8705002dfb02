"""`orch collect --out` into an Iceberg table, a Delta table or a Lance dataset: one commit naming the run.

The run's rows are appended in one commit that carries the run's id.

The forms (as prepare's sources, prepare/tables.py; docs/tables.md):
    iceberg://CATALOG/NAMESPACE.TABLE[?PROPERTY=VALUE&...]   created (namespace too) when absent
    delta:PATH, or a directory holding _delta_log/            created when absent
    lance:PATH, a PATH ending .lance, or a directory holding _versions/
1. Collect as for a Parquet table (collect_table.py: the same columns, every custom_id checked),
   into a temporary file.
2. Read the table's history for a commit carrying this run's id (ORCH_RUN_PROPERTY: an Iceberg
   snapshot summary property, a Delta commit's custom metadata plus its application transaction,
   a Lance transaction property). Found: nothing is appended, and the report says where it is.
3. Otherwise append the file's rows in one commit carrying the run's id: collecting twice never
   writes the rows twice. A run with rows missing is not appended at all (a table gets a run's
   rows once, so they must be all of them).
Two collects of one run racing into one table are not guarded against (the check and the commit
are two steps); one collect after another always is. Expiring snapshots (Iceberg), cleaning the log
(Delta) or old versions (Lance) forgets the run ids they carried: Delta keeps its transaction ids.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import OutputError
from orchestrator.prepare.table_ref import s3_settings
from orchestrator.prepare.tables import TableRef, iceberg_catalog, parse_table, table_kind

if TYPE_CHECKING:
    from orchestrator.collect.report import CollectReport

#: The commit property naming the run whose rows a commit appended.
ORCH_RUN_PROPERTY = "orch.run"
#: Rows read from the temporary Parquet file at a time.
_BATCH = 10_000


def table_sink(out: str) -> TableRef | None:
    """The table `--out` names, or None for a file."""
    kind = table_kind(out)
    if kind is None and out.rstrip("/").endswith(".lance"):
        kind, out = "lance", f"lance:{out}"
    if kind is None:
        return None
    if kind == "hf":
        raise OutputError(
            f"{out}: orch does not write Hugging Face datasets",
            hint="--out answers.parquet, then datasets.load_dataset('parquet', data_files='answers.parquet')",
        )
    ref = parse_table(out if table_kind(out) == kind else f"{kind}:{out}")
    if ref.version is not None:
        raise OutputError(f"{out}: a table is appended to at its latest version: leave @{ref.version} out")
    return ref


def collect_into_table(
    ref: TableRef, out: str, run: str, fmt: str | None, collect_file: Callable[[str], CollectReport]
) -> CollectReport:
    """Steps 1-3; `collect_file(path)` is collect into a Parquet table file."""
    if fmt not in (None, "table"):
        raise OutputError(f"--format {fmt}: a table output holds the table's rows (--format table, or none)")
    sink = _SINKS[ref.kind](ref, out)
    with tempfile.TemporaryDirectory(prefix="orch-collect-") as scratch:
        report = collect_file(str(Path(scratch) / "rows.parquet"))
        report.out, report.format = out, ref.kind
        if not report.out_written:
            return report
        if not report.complete:
            report.out_written = False
            report.table_commit = (
                f"not appended to {out}: a table gets a run's rows once, and {report.missing:,} are missing"
            )
            return report
        found = sink.committed(run)
        if found is not None:
            report.out_written = False
            report.table_commit = f"already in {out} at {found} (run {run!r}): nothing appended"
            return report
        at = sink.append(str(Path(scratch) / "rows.parquet"), run)
        report.table_commit = f"appended to {out} at {at}, in one commit carrying {ORCH_RUN_PROPERTY}={run}"
    return report


def _batches(path: str) -> Any:
    """The file's rows as a stream of record batches (memory bounded by one batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)

    def read() -> Iterator[Any]:
        yield from parquet.iter_batches(batch_size=_BATCH)

    return pa.RecordBatchReader.from_batches(parquet.schema_arrow, read())


def _refused(out: str, e: Exception) -> OutputError:
    return OutputError(
        f"cannot append to {out}: {' '.join(str(e).split())[:500]}",
        where=out,
        hint="the table's columns must be those collect writes (docs/tables.md): append to a new table, "
        "or write --out answers.parquet",
    )


class _Iceberg:
    def __init__(self, ref: TableRef, out: str):
        self.ref, self.out = ref, out
        self.catalog = iceberg_catalog(ref)

    def _table(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.ref.location)
        except NoSuchTableError:
            return None

    def committed(self, run: str) -> str | None:
        table = self._table()
        for snapshot in table.snapshots() if table is not None else []:
            if snapshot.summary is not None and snapshot.summary.get(ORCH_RUN_PROPERTY) == run:
                return f"snapshot {snapshot.snapshot_id}"
        return None

    def append(self, path: str, run: str) -> str:
        rows = _batches(path)
        table = self._table()
        try:
            if table is None:
                self.catalog.create_namespace_if_not_exists(self.ref.location.rsplit(".", 1)[0])
                table = self.catalog.create_table(self.ref.location, schema=rows.schema)
            table.append(rows, snapshot_properties={ORCH_RUN_PROPERTY: run})
        except (ValueError, TypeError) as e:
            raise _refused(self.out, e) from None
        return f"snapshot {table.current_snapshot().snapshot_id}"


class _Delta:
    def __init__(self, ref: TableRef, out: str):
        self.ref, self.out = ref, out

    def _table(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.ref.location, storage_options=s3_settings("delta", self.ref.location))
        except TableNotFoundError:
            return None

    def committed(self, run: str) -> str | None:
        table = self._table()
        if table is None or table.transaction_version(f"orch:{run}") is None:
            return None
        versions = [h["version"] for h in table.history() if h.get(ORCH_RUN_PROPERTY) == run]
        return f"version {versions[0]}" if versions else "a version whose log entry was cleaned up"

    def append(self, path: str, run: str) -> str:
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import DeltaError

        commit = CommitProperties(
            custom_metadata={ORCH_RUN_PROPERTY: run}, app_transactions=[Transaction(app_id=f"orch:{run}", version=1)]
        )
        try:
            write_deltalake(
                self.ref.location,
                _batches(path),
                mode="append",
                commit_properties=commit,
                storage_options=s3_settings("delta", self.ref.location),
            )
        except (DeltaError, ValueError) as e:
            raise _refused(self.out, e) from None
        return f"version {self._table().version()}"


class _Lance:
    def __init__(self, ref: TableRef, out: str):
        self.ref, self.out = ref, out

    def _dataset(self) -> Any:
        import lance

        try:
            return lance.dataset(self.ref.location, storage_options=s3_settings("lance", self.ref.location))
        except (ValueError, OSError):
            return None

    def committed(self, run: str) -> str | None:
        dataset = self._dataset()
        if dataset is None:
            return None
        # Newest first, one per version: the transaction that made it (None where none is kept).
        for back, transaction in enumerate(dataset.get_transactions(dataset.version)):
            if transaction is not None and (transaction.transaction_properties or {}).get(ORCH_RUN_PROPERTY) == run:
                return f"version {dataset.version - back}"
        return None

    def append(self, path: str, run: str) -> str:
        import lance

        mode = "create" if self._dataset() is None else "append"
        try:
            dataset = lance.write_dataset(
                _batches(path),
                self.ref.location,
                mode=mode,
                transaction_properties={ORCH_RUN_PROPERTY: run},
                storage_options=s3_settings("lance", self.ref.location),
            )
        except (ValueError, OSError) as e:
            raise _refused(self.out, e) from None
        return f"version {dataset.version}"


_SINKS: dict[str, Any] = {"iceberg": _Iceberg, "delta": _Delta, "lance": _Lance}

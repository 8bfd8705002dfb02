"""`orch collect --out` into an Iceberg table, a Delta table or a Lance dataset: one commit naming the run.

The run's rows are appended, or merged on a column (`--merge-on`), in one commit that carries the run's id.

The forms (as prepare's sources, prepare/table_sources/tables.py; docs/tables.md):
    iceberg://CATALOG/NAMESPACE.TABLE[?PROPERTY=VALUE&...]   created (namespace too) when absent
    delta:PATH, or a directory holding _delta_log/            created when absent
    lance:PATH, a PATH ending .lance, or a directory holding _versions/
1. Collect as for a Parquet table (table.py: the same columns, every custom_id checked), into a
   temporary file (in a folder scratch.py names, removed by the next collect if this one is killed).
2. Read the table's history for a commit carrying this run's id (ORCH_RUN_PROPERTY: an Iceberg
   snapshot summary property, a Delta commit's custom metadata plus its application transaction,
   a Lance transaction property). Found: nothing is written, and the report says where it is.
3. Check the run's columns against the table's, the same way for the three kinds: the same names
   with the same types, or a refusal naming each column that differs (no library's own rule, which
   differ: Iceberg and Lance would fill a missing column with nulls, Delta refuses). Order aside:
   the rows are written in the table's order. With `--merge-on`, the column must be the run's, and
   hold a value, a different one, on every row.
4. Otherwise write the file's rows in one commit carrying the run's id: appended, or merged on the
   column through the library's own merge (Iceberg upsert, Delta MERGE, Lance merge_insert: a row
   whose key the table has replaces that row, any other is inserted). Collecting twice never
   writes the rows twice. A run with rows missing is not written at all (a table gets a run's
   rows once, so they must be all of them).
Two collects of one run racing into one table are not guarded against (the check and the commit
are two steps); one collect after another always is. Expiring snapshots (Iceberg), cleaning the log
(Delta) or old versions (Lance) forgets the run ids they carried: Delta keeps its transaction ids.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.collect.scratch import scratch_dir
from orchestrator.core.errors import OutputError
from orchestrator.prepare.table_sources.table_ref import s3_settings
from orchestrator.prepare.table_sources.tables import TableRef, iceberg_catalog, parse_table, table_kind

if TYPE_CHECKING:
    from orchestrator.collect.report import CollectReport

#: The commit property naming the run whose rows a commit appended.
ORCH_RUN_PROPERTY = "orch.run"
#: Rows read from the temporary Parquet file at a time.
_BATCH = 10_000
#: Repeated merge keys named in an error.
_SHOWN = 3
#: The columns every table has (table.py), and their types, that an older orch wrote in some runs only.
EVERY_TABLE = {"reused": "boolean", "escalated": "string"}


@dataclasses.dataclass(frozen=True)
class Written:
    """What one commit did: where the table is now, and the rows a merge inserted and updated."""

    at: str
    inserted: int | None = None
    #: As the library counts them: Iceberg only rows whose values changed, Delta and Lance every matched row.
    updated: int | None = None


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
    ref: TableRef,
    out: str,
    run: str,
    fmt: str | None,
    collect_file: Callable[[str], CollectReport],
    merge_on: str | None = None,
) -> CollectReport:
    """Steps 1-4; `collect_file(path)` is collect into a Parquet table file."""
    if fmt not in (None, "table"):
        raise OutputError(f"--format {fmt}: a table output holds the table's rows (--format table, or none)")
    sink = _SINKS[ref.kind](ref, out)
    scratch = scratch_dir()
    try:
        rows = os.path.join(scratch, "rows.parquet")
        report = collect_file(rows)
        report.out, report.format = out, ref.kind
        if not report.out_written:
            return report
        verb = "merged into" if merge_on else "appended to"
        if not report.complete:
            report.out_written = False
            report.table_commit = (
                f"not {verb} {out}: a table gets a run's rows once, and {report.missing:,} are missing"
            )
            return report
        found = sink.committed(run)
        if found is not None:
            report.out_written = False
            report.table_commit = f"already in {out} at {found} (run {run!r}): nothing written"
            return report
        report.table_commit = _write(sink, out, rows, run, merge_on)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _write(sink: Any, out: str, rows: str, run: str, merge_on: str | None) -> str:
    """Steps 3-4: the columns checked, the rows written; what the report says of the commit."""
    import pyarrow.parquet as pq

    columns = pq.read_schema(rows)
    if merge_on is not None:
        _check_merge_key(out, rows, columns, merge_on)
    existing = sink.schema()
    order = columns.names if existing is None else _same_columns(out, existing, columns, merge_on)
    carrying = f"in one commit carrying {ORCH_RUN_PROPERTY}={run}"
    if existing is None or merge_on is None:  # a new table is made by its first run's rows
        written = sink.append(rows, run, order)
        return f"appended to {out} at {written.at}, {carrying}"
    written = sink.merge(rows, run, order, merge_on)
    if written.inserted == written.updated == 0:
        return f"merged into {out} on {merge_on}: nothing changed, no commit"
    counts = f"{written.inserted:,} row(s) inserted, {written.updated:,} updated"
    return f"merged into {out} on {merge_on} at {written.at}: {counts}, {carrying}"


def _check_merge_key(out: str, rows: str, columns: Any, merge_on: str) -> None:
    """The merge column is one of the run's, and holds a value, a different one, on every row."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if merge_on not in columns.names:
        close = difflib.get_close_matches(merge_on, columns.names, n=1)
        raise OutputError(
            f"--merge-on {merge_on}: the run's table has no such column (its columns: {', '.join(columns.names)})",
            where=out,
            hint=f"did you mean {close[0]!r}?" if close else "name the column that identifies a row, e.g. the id",
        )
    if pa.types.is_nested(columns.field(merge_on).type):
        raise OutputError(f"--merge-on {merge_on}: a list column cannot identify a row", where=out)
    keys = pq.read_table(rows, columns=[merge_on]).column(merge_on)
    if keys.null_count:
        raise OutputError(
            f"--merge-on {merge_on}: {keys.null_count:,} row(s) of the run have no {merge_on}: a row without a key "
            "cannot be merged",
            where=out,
            hint="merge on a column every row has (the id is always there)",
        )
    counts = pc.value_counts(keys)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        shown = ", ".join(f"{v['values']!r} ({v['counts']} rows)" for v in repeated.to_pylist()[:_SHOWN])
        raise OutputError(
            f"--merge-on {merge_on}: {len(repeated):,} value(s) are on more than one row of the run: {shown}",
            where=out,
            hint="a merge keeps one row per key: merge on a column that differs from row to row (the id does)",
        )


def _same_columns(out: str, table: Any, run: Any, merge_on: str | None) -> list[str]:
    """Step 3: the table's column order, when the run's columns are the table's (names and types)."""
    have = {f.name: _type_name(f.type) for f in table}
    new = {f.name: _type_name(f.type) for f in run}
    lacking = [name for name in have if name not in new]
    extra = [name for name in new if name not in have]
    retyped = [
        f"{name} is {have[name]} in the table and {new[name]} in the run"
        for name in new
        if name in have and have[name] != new[name]
    ]
    if not (lacking or extra or retyped):
        return list(have)
    differences = ([f"the table has {', '.join(lacking)}, the run does not"] if lacking else []) + (
        [f"the run has {', '.join(extra)}, the table does not"] if extra else []
    )
    hint = "collect with the --keep-columns (and the --json-schema) of the runs already in the table, "
    if extra and set(extra) <= set(EVERY_TABLE):  # a table an older orch made, before they were in every table
        hint = f"add {' and '.join(f'{n} ({EVERY_TABLE[n]})' for n in extra)} to the table (its library's schema "
        hint += "evolution: the rows there get nulls), "
    raise OutputError(
        f"cannot {'merge into' if merge_on else 'append to'} {out}: the run's columns are not the table's: "
        + "; ".join(differences + retyped),
        where=out,
        hint=hint + "or collect into a new table (docs/tables.md lists the columns)",
    )


def _type_name(kind: Any) -> str:
    """An Arrow type as the three libraries' schemas agree on it (a string is a string, large or not)."""
    import pyarrow as pa

    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return "binary"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return f"list<{_type_name(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return "struct<" + ", ".join(f"{f.name}: {_type_name(f.type)}" for f in kind) + ">"
    return str(kind)


def _batches(path: str, order: list[str]) -> Any:
    """The file's rows as a stream of record batches, columns in `order` (memory bounded by one batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    schema = pa.schema([parquet.schema_arrow.field(name) for name in order])

    def read() -> Iterator[Any]:
        for batch in parquet.iter_batches(batch_size=_BATCH):
            yield batch.select(order)

    return pa.RecordBatchReader.from_batches(schema, read())


def _refused(out: str, e: Exception) -> OutputError:
    return OutputError(
        f"cannot write to {out}: {' '.join(str(e).split())[:500]}",
        where=out,
        hint="the table's columns must be those collect writes (docs/tables.md): write to a new table, "
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

    def schema(self) -> Any:
        table = self._table()
        return table.schema().as_arrow() if table is not None else None

    def append(self, path: str, run: str, order: list[str]) -> Written:
        rows = _batches(path, order)
        table = self._table()
        try:
            if table is None:
                self.catalog.create_namespace_if_not_exists(self.ref.location.rsplit(".", 1)[0])
                table = self.catalog.create_table(self.ref.location, schema=rows.schema)
            table.append(rows, snapshot_properties={ORCH_RUN_PROPERTY: run})
        except (ValueError, TypeError) as e:
            raise _refused(self.out, e) from None
        return Written(f"snapshot {table.current_snapshot().snapshot_id}")

    def merge(self, path: str, run: str, order: list[str], key: str) -> Written:
        """pyiceberg's upsert, a batch at a time (memory bounded by one), all in one transaction:
        one commit, each of its snapshots carrying the run."""
        import pyarrow as pa

        table = self._table()
        inserted = updated = 0
        try:
            with table.transaction() as transaction:
                for batch in _batches(path, order):
                    done = transaction.upsert(
                        pa.Table.from_batches([batch]), join_cols=[key], snapshot_properties={ORCH_RUN_PROPERTY: run}
                    )
                    inserted, updated = inserted + done.rows_inserted, updated + done.rows_updated
        except (ValueError, TypeError) as e:
            raise _refused(self.out, e) from None
        return Written(f"snapshot {self._table().current_snapshot().snapshot_id}", inserted, updated)


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

    def schema(self) -> Any:
        import pyarrow as pa

        table = self._table()
        return pa.schema(table.schema().to_arrow()) if table is not None else None

    def _commit(self, run: str) -> Any:
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            custom_metadata={ORCH_RUN_PROPERTY: run}, app_transactions=[Transaction(app_id=f"orch:{run}", version=1)]
        )

    def append(self, path: str, run: str, order: list[str]) -> Written:
        from deltalake import write_deltalake
        from deltalake.exceptions import DeltaError

        try:
            write_deltalake(
                self.ref.location,
                _batches(path, order),
                mode="append",
                commit_properties=self._commit(run),
                storage_options=s3_settings("delta", self.ref.location),
            )
        except (DeltaError, ValueError) as e:
            raise _refused(self.out, e) from None
        return Written(f"version {self._table().version()}")

    def merge(self, path: str, run: str, order: list[str], key: str) -> Written:
        from deltalake.exceptions import DeltaError

        quoted = '"' + key.replace('"', '""') + '"'
        try:
            metrics = (
                self._table()
                .merge(
                    _batches(path, order),
                    predicate=f"target.{quoted} = source.{quoted}",
                    source_alias="source",
                    target_alias="target",
                    commit_properties=self._commit(run),
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        except (DeltaError, ValueError) as e:
            raise _refused(self.out, e) from None
        inserted, updated = metrics["num_target_rows_inserted"], metrics["num_target_rows_updated"]
        return Written(f"version {self._table().version()}", inserted, updated)


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

    def schema(self) -> Any:
        dataset = self._dataset()
        return dataset.schema if dataset is not None else None

    def append(self, path: str, run: str, order: list[str]) -> Written:
        import lance

        mode = "create" if self._dataset() is None else "append"
        try:
            dataset = lance.write_dataset(
                _batches(path, order),
                self.ref.location,
                mode=mode,
                transaction_properties={ORCH_RUN_PROPERTY: run},
                storage_options=s3_settings("lance", self.ref.location),
            )
        except (ValueError, OSError) as e:
            raise _refused(self.out, e) from None
        return Written(f"version {dataset.version}")

    def merge(self, path: str, run: str, order: list[str], key: str) -> Written:
        """lance's merge_insert, prepared uncommitted so that its commit carries the run."""
        import lance

        settings = s3_settings("lance", self.ref.location)
        try:
            builder = self._dataset().merge_insert(key).when_matched_update_all().when_not_matched_insert_all()
            transaction, stats = builder.execute_uncommitted(_batches(path, order))
            transaction = dataclasses.replace(transaction, transaction_properties={ORCH_RUN_PROPERTY: run})
            dataset = lance.LanceDataset.commit(
                self.ref.location, transaction, read_version=transaction.read_version, storage_options=settings
            )
        except (ValueError, OSError) as e:
            raise _refused(self.out, e) from None
        return Written(f"version {dataset.version}", stats["num_inserted_rows"], stats["num_updated_rows"])


_SINKS: dict[str, Any] = {"iceberg": _Iceberg, "delta": _Delta, "lance": _Lance}

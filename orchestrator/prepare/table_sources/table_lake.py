"""Iceberg and Delta Lake tables: opened at a version, read in the order rows were appended, and read incrementally."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from orchestrator.core.errors import InputError
from orchestrator.prepare.formats import close_names
from orchestrator.prepare.source_file import PARQUET_BATCH
from orchestrator.prepare.table_sources.table_ref import (
    LATEST_SHOWN,
    TableRef,
    no_version,
    s3_settings,
    same_columns,
    when_utc,
)


# -- Iceberg -----------------------------------------------------------------------------------
def iceberg_catalog(ref: TableRef) -> Any:
    """The catalog, from pyiceberg's configuration and the source's query properties; the S3
    endpoint and region from the environment where neither names them (table_ref.s3_settings)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.utils.config import Config

    configured = Config().get_catalog_config(ref.catalog) or {}
    from_environment = {k: v for k, v in s3_settings("iceberg", "").items() if k not in configured}
    return load_catalog(ref.catalog, **{**from_environment, **ref.properties})


def iceberg_pinned(ref: TableRef, table: Any, source: str) -> tuple[str, str, int]:
    """(snapshot id, table id, rows) of what will be read."""
    snapshot = iceberg_snapshot(ref, table, source)
    if snapshot is None:
        return "empty", str(table.metadata.table_uuid), 0
    return str(snapshot.snapshot_id), str(table.metadata.table_uuid), iceberg_scan(table, snapshot, None).count()


def iceberg_schema(ref: TableRef, table: Any) -> Any:
    """The Arrow schema of the snapshot read."""
    snapshot = iceberg_snapshot(ref, table, ref.location)
    schema_id = snapshot.schema_id if snapshot is not None else None
    schemas = table.schemas()
    return (schemas[schema_id] if schema_id in schemas else table.schema()).as_arrow()


def iceberg_table(ref: TableRef, source: str) -> Any:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = iceberg_catalog(ref)
    namespace = ref.location.rsplit(".", 1)[0]
    try:
        return catalog.load_table(ref.location)
    except (NoSuchTableError, NoSuchNamespaceError):
        try:
            there = [".".join(t) for t in catalog.list_tables(namespace)]
        except NoSuchNamespaceError:
            spaces = [".".join(n) for n in catalog.list_namespaces()]
            raise InputError(
                f"no namespace {namespace!r} in Iceberg catalog {ref.catalog!r} "
                f"(it has: {', '.join(spaces) or 'none'})",
                where=source,
            ) from None
        raise InputError(
            f"no table {ref.location!r} in Iceberg catalog {ref.catalog!r} "
            f"(namespace {namespace} has: {', '.join(there) or 'no tables'}{close_names([ref.location], there)})",
            where=source,
        ) from None


def iceberg_snapshot(ref: TableRef, table: Any, source: str) -> Any:
    if ref.version is None:
        return table.current_snapshot()
    snapshot = table.snapshot_by_id(int(ref.version))
    if snapshot is None:
        latest = [f"{s.snapshot_id} ({when_utc(s.timestamp_ms)})" for s in table.snapshots()[-LATEST_SHOWN:]][::-1]
        raise no_version(source, "snapshot", ref.version, latest)
    return snapshot


def iceberg_scan(table: Any, snapshot: Any, columns: list[str] | None) -> Any:
    return table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=tuple(columns) if columns else ("*",))


def iceberg_rows(table: Any, snapshot: Any, columns: list[str] | None, only: set[str] | None) -> Iterator[Any]:
    """The snapshot's rows (of the files in `only`, when given) in the order they were appended:
    pyiceberg plans the newest manifest's files first, so its own order would put a new append's
    rows before the old ones and renumber every row."""
    from pyiceberg.io.pyarrow import ArrowScan

    appended: dict[str, int] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            appended[entry.data_file.file_path] = entry.sequence_number or 0
    scan = iceberg_scan(table, snapshot, columns)
    tasks = [task for task in scan.plan_files() if only is None or task.file.file_path in only]
    tasks.sort(key=lambda task: appended.get(task.file.file_path, 0))
    arrow = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter)
    wanted = _field_ids(scan.projection())
    for task in tasks:
        if not (yield from _plain_iceberg_file(table.io, task, wanted)):
            yield from _streamed(arrow, table.io, [task])


def _field_ids(schema: Any) -> dict[str, int]:
    """Column name -> Iceberg field id of a projected schema's top-level columns."""
    return {field.name: field.field_id for field in schema.fields}


def _plain_iceberg_file(io: Any, task: Any, wanted: dict[str, int]) -> Generator[Any, None, bool]:
    """One data file's rows read as a plain Parquet file, where that reads what Iceberg would: no
    delete files, and every wanted column in the file under its name with its field id (a renamed,
    dropped-and-added or missing column goes through pyiceberg's projection). pyiceberg reads each
    file through a dataset scan with its own projection per batch: with it, the source's read ran at
    0.47-0.89x the Parquet source's rows/s, with this 0.85-0.86x (bench/table_sources_bench.py).
    Returns whether it read the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if task.delete_files or not task.file.file_path.endswith(".parquet"):
        return False
    with io.new_input(task.file.file_path).open() as fin, pq.ParquetFile(fin, pre_buffer=True) as parquet:
        held = parquet.schema_arrow
        for name, field_id in wanted.items():
            field = held.field(name) if name in held.names else None
            metadata = (field.metadata or {}) if field is not None else {}
            if field is None or metadata.get(b"PARQUET:field_id") != str(field_id).encode():
                return False
            if pa.types.is_nested(field.type) or pa.types.is_timestamp(field.type):
                return False  # what pyiceberg casts (nested field ids, ns timestamps): its own path
        yield from parquet.iter_batches(batch_size=PARQUET_BATCH, columns=list(wanted))
    return True


def _streamed(arrow: Any, io: Any, tasks: list[Any]) -> Iterator[Any]:
    """The tasks' batches as each file is decoded. pyiceberg's public `to_record_batches` reads
    each data file whole into a list before yielding its first batch: memory grows with the file,
    and nothing is converted while it decodes (table_sources_bench: wall ~0.7x Parquet's). The
    per-task generator it wraps streams; where a pyiceberg release lacks it, the public call."""
    from pyiceberg.io.pyarrow import _read_all_delete_files

    stream = getattr(arrow, "_record_batches_from_scan_tasks_and_deletes", None)
    if stream is None:
        yield from arrow.to_record_batches(tasks)
        return
    yield from stream(tasks, _read_all_delete_files(io, tasks))


# -- Delta Lake --------------------------------------------------------------------------------
def delta_table(ref: TableRef, source: str) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(ref.location, storage_options=s3_settings("delta", ref.location))
    except TableNotFoundError:
        raise InputError(f"no Delta table at {ref.location} (no _delta_log/ there)", where=source) from None
    if ref.version is not None and int(ref.version) != table.version():
        try:
            table.load_as_version(int(ref.version))
        except DeltaError:
            latest = [f"{h['version']} ({when_utc(h['timestamp'])})" for h in table.history(LATEST_SHOWN)]
            raise no_version(source, "version", ref.version, latest) from None
    return table


def delta_pinned(table: Any) -> tuple[str, str, int]:
    """(version, table id, rows) of what will be read."""
    rows = sum(int(n) for n in table.get_add_actions(flatten=True).column("num_records").to_pylist() if n)
    return str(table.version()), str(table.metadata().id), rows


def delta_schema(table: Any) -> Any:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def delta_rows(table: Any, columns: list[str] | None, only: set[str] | None) -> Iterator[Any]:
    """The version's rows (of the files in `only`, when given) in the order they were appended
    (the files' times, then names): a replay of the log lists the newest files first."""
    adds = table.get_add_actions(flatten=True)
    written = dict(zip(adds.column("path").to_pylist(), adds.column("modification_time").to_pylist(), strict=True))
    whole = table.to_pyarrow_dataset()
    fragments = [f for f in whole.get_fragments() if only is None or f.path in only]
    fragments.sort(key=lambda f: (written.get(f.path) or 0, f.path))
    partitioned = bool(table.metadata().partition_columns)
    local = _local_root(table.table_uri)
    for fragment in fragments:
        yield from _delta_file_rows(fragment, whole, columns or whole.schema.names, partitioned, local)


def _local_root(uri: str) -> str | None:
    """The table's directory when it is on local disk, else None."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    return unquote(parts.path).rstrip("/") if parts.scheme == "file" else None


def _delta_file_rows(
    fragment: Any, whole: Any, columns: list[str], partitioned: bool, local: str | None
) -> Iterator[Any]:
    """One data file's rows. Read as a plain Parquet file where it holds the columns as the table
    types them: pyarrow's file reader streams it faster than a dataset scan, which starts a scan and
    its thread pools per call (bench/table_sources_bench.py). Through the dataset otherwise:
    partition values (not in the files), columns added after the file was written (nulls), a type
    the table has since widened. A local file is opened by pyarrow itself, not through deltalake's
    filesystem, whose every read goes through Python (about 20% more CPU per file, measured)."""
    import pyarrow.parquet as pq

    here = local is not None and "://" not in fragment.path
    path, filesystem = (f"{local}/{fragment.path}", None) if here else (fragment.path, whole.filesystem)
    with pq.ParquetFile(path, filesystem=filesystem, pre_buffer=True) as parquet:
        held = parquet.schema_arrow
        if not partitioned and all(
            n in held.names and held.field(n).type == whole.schema.field(n).type for n in columns
        ):
            yield from parquet.iter_batches(batch_size=PARQUET_BATCH, columns=columns)
            return
    yield from fragment.to_batches(schema=whole.schema, columns=columns, batch_size=PARQUET_BATCH)


def iceberg_appended(ref: TableRef, source: str, since: str, columns: list[str] | None) -> Iterator[Any]:
    from pyiceberg.manifest import ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation

    table = iceberg_table(ref, source)
    now = iceberg_snapshot(ref, table, source)
    then = iceberg_snapshot(TableRef(ref.kind, ref.location, since), table, source)
    same_columns(
        source,
        since,
        iceberg_schema(TableRef(ref.kind, ref.location, since), table),
        iceberg_schema(ref, table),
        columns,
    )
    added: set[str] = set()
    snapshot = now
    while snapshot.snapshot_id != then.snapshot_id:
        operation = snapshot.summary.operation if snapshot.summary is not None else None
        if operation != Operation.APPEND:
            raise InputError(
                f"snapshot {snapshot.snapshot_id} is {operation}: rows changed since {since}, not only appended",
                where=source,
                hint="read the whole table",
            )
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id == snapshot.snapshot_id:
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    if entry.status == ManifestEntryStatus.ADDED:
                        added.add(entry.data_file.file_path)
        if snapshot.parent_snapshot_id is None:
            raise InputError(f"snapshot {since} is not an ancestor of snapshot {now.snapshot_id}", where=source)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    yield from iceberg_rows(table, now, columns, added)


def delta_appended(ref: TableRef, source: str, since: str, columns: list[str] | None) -> Iterator[Any]:
    now = delta_table(ref, source)
    then = delta_table(TableRef(ref.kind, ref.location, since), source)
    if int(since) > now.version():
        raise InputError(f"version {since} is after version {now.version()}, the one read", where=source)
    same_columns(source, since, delta_schema(then), delta_schema(now), columns)
    before = set(then.get_add_actions(flatten=True).column("path").to_pylist())
    after = now.get_add_actions(flatten=True).column("path").to_pylist()
    if before - set(after):
        raise InputError(
            f"{len(before - set(after))} data file(s) of version {since} are gone by version {now.version()}: "
            "rows changed, not only appended",
            where=source,
            hint="read the whole table",
        )
    yield from delta_rows(now, columns, set(after) - before)

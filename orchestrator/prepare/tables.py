"""Table sources: Iceberg, Delta Lake, Lance and Hugging Face datasets, read at one pinned version as record batches.

The forms a source takes (docs/tables.md):
    iceberg://CATALOG/NAMESPACE.TABLE[@SNAPSHOT][?PROPERTY=VALUE&...]
        a catalog pyiceberg's configuration names (~/.pyiceberg.yaml, PYICEBERG_CATALOG__* variables),
        or whose properties the query gives (`?type=sql&uri=sqlite:///c.db&warehouse=file:///wh`)
    delta:PATH[@VERSION]       or a directory holding _delta_log/ (PATH may be s3://...)
    lance:PATH[@VERSION]       or a directory holding _versions/ (a `.lance` dataset)
    hf:PATH[#SPLIT]            or a folder `datasets` saved with save_to_disk, or one of its .arrow files
    hf://datasets/ORG/NAME[@REVISION][/PATH]   the hub's Parquet files, through huggingface_hub's filesystem
A table is resolved once, to the version it is read at (the latest unless `@` names one), and that
version is its identity: the same command twice is a no-op, a new snapshot is new input. Rows are
numbered 0, 1, ... in the order a scan of that version gives them, as with Parquet files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator.core.errors import InputError
from orchestrator.prepare.formats import close_names
from orchestrator.prepare.sources import PARQUET_BATCH, SourceFile, read_ahead

#: Versions listed when the one asked for does not exist.
LATEST_SHOWN = 5
_VERSION = re.compile(r"@(\d+)$")
_PREFIXES = {"iceberg://": "iceberg", "delta:": "delta", "lance:": "lance", "hf://": "hf", "hf:": "hf"}


@dataclass(frozen=True)
class TableRef:
    """A table source as written: its kind, where it is, the version asked for (None: the latest)."""

    kind: str  # iceberg | delta | lance | hf
    location: str  # a path or URI; for Iceberg the table's name, NAMESPACE.TABLE
    version: str | None = None
    catalog: str = ""  # Iceberg: the catalog's name
    properties: dict[str, str] = field(default_factory=dict)  # Iceberg: the catalog's properties
    split: str | None = None  # a saved DatasetDict's split


def table_kind(source: str) -> str | None:
    """The kind of table a source names (by its prefix, or what its directory holds), else None."""
    for prefix, kind in _PREFIXES.items():
        if source.startswith(prefix):
            return kind
    if source.startswith(("s3://", "r2://")):
        return None
    path = Path(_VERSION.sub("", source.split("#", 1)[0]).removeprefix("file://"))
    if path.is_dir():
        if (path / "_delta_log").is_dir():
            return "delta"
        if (path / "_versions").is_dir():
            return "lance"
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "hf"
    return "hf" if path.suffix == ".arrow" and path.is_file() else None


def parse_table(source: str) -> TableRef:
    """The source's parts; InputError for a form that is not one of the module's."""
    kind = table_kind(source)
    if kind is None:
        raise InputError(f"{source}: not a table source", where=source)
    if kind == "iceberg":
        parts = urlsplit(source)
        name, version = _split_version(parts.path.lstrip("/"))
        if not parts.netloc or "." not in name:
            raise InputError(
                f"{source}: an Iceberg source is iceberg://CATALOG/NAMESPACE.TABLE[@SNAPSHOT]", where=source
            )
        return TableRef(kind, name, version, parts.netloc, dict(parse_qsl(parts.query)))
    if source.startswith("hf://"):
        return TableRef(kind, source)  # the hub's paths carry their revision (@REV) themselves
    location = source.removeprefix(f"{kind}:") if source.startswith(f"{kind}:") else source
    location, _, split = location.partition("#")
    location, version = _split_version(location)
    return TableRef(kind, location.removeprefix("file://"), version, split=split or None)


def _split_version(text: str) -> tuple[str, str | None]:
    found = _VERSION.search(text)
    return (text[: found.start()], found.group(1)) if found else (text, None)


def resolve_table(source: str) -> SourceFile:
    """The table at the version it will be read at: its rows, its columns and what identifies it."""
    ref = parse_table(source)
    opened = _open(ref, source)
    version, table_id, rows = _pinned(ref, opened, source)
    schema = _schema(ref, opened)
    name = ref.location.rstrip("/").rsplit("/", 1)[-1] + (f"#{ref.split}" if ref.split else "")
    return SourceFile(
        source,
        name,
        ref.kind,
        rows,
        etag=table_id,
        version=version,
        columns=tuple(f"{f.name}: {f.type}" for f in schema),
    )


def table_digest(source: SourceFile) -> str:
    """The table's identity as prepare records it: kind, table id and version."""
    return f"{source.kind}:{source.etag}@{source.version}"


def table_batches(source: SourceFile, columns: list[str] | None) -> Iterator[Any]:
    """Record batches of the table at its pinned version, only the named columns."""
    ref = parse_table(source.uri)
    ref = TableRef(ref.kind, ref.location, source.version, ref.catalog, ref.properties, ref.split)
    opened = _open(ref, source.uri)
    names = [f.name for f in _schema(ref, opened)]
    missing = [c for c in columns or [] if c not in names]
    if missing:
        raise InputError(
            f"column(s) {', '.join(missing)} not in the table "
            f"(it has: {', '.join(names)}{close_names(missing, names)})",
            where=source.uri,
            hint="name the right columns (--id-column, input.conversation_column, input.text_column)",
        )
    yield from read_ahead(_batches(ref, opened, columns))


def table_identity(source: SourceFile) -> dict[str, Any]:
    """What prepare's record keeps of a table beyond its digest: the version and the columns."""
    return {"version": source.version, "columns": list(source.columns)}


def table_differences(then: dict[str, Any], now: SourceFile) -> list[str]:
    """How the table now differs from the version prepared: another version, and its schema changes."""
    if then.get("digest") == table_digest(now):
        return []
    word = "snapshot" if now.kind == "iceberg" else "version"
    out = [
        f"{now.uri}: {word} {now.version} ({now.size:,} rows) now, "
        f"{word} {then.get('version', '?')} ({then.get('size', 0):,} rows) when prepared"
        f" (a new {word} is new input: prepare it under a new --run, "
        f"or read the prepared one with @{then.get('version')})"
    ]
    before, after = list(then.get("columns") or []), list(now.columns)
    if before and before != after:
        removed = [c for c in before if c not in after]
        added = [c for c in after if c not in before]
        out.append(
            f"{now.uri}: the schema changed between them: "
            + "; ".join(
                ([f"removed {', '.join(removed)}"] if removed else [])
                + ([f"added {', '.join(added)}"] if added else [])
            )
        )
    return out


# -- per kind: open, pin, schema, batches ------------------------------------------------------
def _open(ref: TableRef, source: str) -> Any:
    """The library's handle on the table (at the asked version where the library opens at one)."""
    if ref.kind == "iceberg":
        return _iceberg_table(ref, source)
    if ref.kind == "delta":
        return _delta_table(ref, source)
    if ref.kind == "lance":
        return _lance_dataset(ref, source)
    return _hf_files(ref, source)


def _pinned(ref: TableRef, opened: Any, source: str) -> tuple[str, str, int]:
    """(version, table id, rows) of what will be read."""
    if ref.kind == "iceberg":
        snapshot = _iceberg_snapshot(ref, opened, source)
        if snapshot is None:
            return "empty", str(opened.metadata.table_uuid), 0
        return str(snapshot.snapshot_id), str(opened.metadata.table_uuid), _iceberg_scan(opened, snapshot, None).count()
    if ref.kind == "delta":
        rows = sum(int(n) for n in opened.get_add_actions(flatten=True).column("num_records").to_pylist() if n)
        return str(opened.version()), str(opened.metadata().id), rows
    if ref.kind == "lance":
        created = {v["version"]: v["timestamp"] for v in opened.versions()}.get(opened.version)
        return str(opened.version), f"created {created}", int(opened.count_rows())
    return opened.version, opened.table_id, sum(b.num_rows for b in _hf_batches(opened, None))


def _schema(ref: TableRef, opened: Any) -> Any:
    """The table's Arrow schema at the pinned version."""
    import pyarrow as pa

    if ref.kind == "iceberg":
        snapshot = _iceberg_snapshot(ref, opened, ref.location)
        schema_id = snapshot.schema_id if snapshot is not None else None
        schemas = opened.schemas()
        return (schemas[schema_id] if schema_id in schemas else opened.schema()).as_arrow()
    if ref.kind == "delta":
        return pa.schema(opened.schema().to_arrow())
    if ref.kind == "lance":
        return opened.schema
    return opened.schema


def _batches(ref: TableRef, opened: Any, columns: list[str] | None) -> Iterator[Any]:
    if ref.kind == "iceberg":
        snapshot = _iceberg_snapshot(ref, opened, ref.location)
        if snapshot is not None:
            yield from _iceberg_rows(opened, snapshot, columns, None)
    elif ref.kind == "delta":
        yield from _delta_rows(opened, columns, None)
    elif ref.kind == "lance":
        yield from opened.to_batches(columns=columns, batch_size=PARQUET_BATCH, scan_in_order=True)
    else:
        yield from _hf_batches(opened, columns)


# -- Iceberg -----------------------------------------------------------------------------------
def iceberg_catalog(ref: TableRef) -> Any:
    """The catalog, from pyiceberg's configuration and the source's query properties."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(ref.catalog, **ref.properties)


def _iceberg_table(ref: TableRef, source: str) -> Any:
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


def _iceberg_snapshot(ref: TableRef, table: Any, source: str) -> Any:
    if ref.version is None:
        return table.current_snapshot()
    snapshot = table.snapshot_by_id(int(ref.version))
    if snapshot is None:
        latest = [f"{s.snapshot_id} ({_when(s.timestamp_ms)})" for s in table.snapshots()[-LATEST_SHOWN:]][::-1]
        raise _no_version(source, "snapshot", ref.version, latest)
    return snapshot


def _iceberg_scan(table: Any, snapshot: Any, columns: list[str] | None) -> Any:
    return table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=tuple(columns) if columns else ("*",))


def _iceberg_rows(table: Any, snapshot: Any, columns: list[str] | None, only: set[str] | None) -> Iterator[Any]:
    """The snapshot's rows (of the files in `only`, when given) in the order they were appended:
    pyiceberg plans the newest manifest's files first, so its own order would put a new append's
    rows before the old ones and renumber every row."""
    from pyiceberg.io.pyarrow import ArrowScan

    appended: dict[str, int] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            appended[entry.data_file.file_path] = entry.sequence_number or 0
    scan = _iceberg_scan(table, snapshot, columns)
    tasks = [task for task in scan.plan_files() if only is None or task.file.file_path in only]
    tasks.sort(key=lambda task: appended.get(task.file.file_path, 0))
    yield from ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter).to_record_batches(tasks)


# -- Delta Lake --------------------------------------------------------------------------------
def _delta_table(ref: TableRef, source: str) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(ref.location)
    except TableNotFoundError:
        raise InputError(f"no Delta table at {ref.location} (no _delta_log/ there)", where=source) from None
    if ref.version is not None and int(ref.version) != table.version():
        try:
            table.load_as_version(int(ref.version))
        except DeltaError:
            latest = [f"{h['version']} ({_when(h['timestamp'])})" for h in table.history(LATEST_SHOWN)]
            raise _no_version(source, "version", ref.version, latest) from None
    return table


def _delta_rows(table: Any, columns: list[str] | None, only: set[str] | None) -> Iterator[Any]:
    """The version's rows (of the files in `only`, when given) in the order they were appended
    (the files' times, then names): a replay of the log lists the newest files first."""
    import pyarrow.dataset as ds

    adds = table.get_add_actions(flatten=True)
    written = dict(zip(adds.column("path").to_pylist(), adds.column("modification_time").to_pylist(), strict=True))
    whole = table.to_pyarrow_dataset()
    fragments = [f for f in whole.get_fragments() if only is None or f.path in only]
    fragments.sort(key=lambda f: (written.get(f.path) or 0, f.path))
    dataset = ds.FileSystemDataset(fragments, whole.schema, whole.format, whole.filesystem)
    yield from dataset.to_batches(columns=columns, batch_size=PARQUET_BATCH)


# -- Lance -------------------------------------------------------------------------------------
def _lance_dataset(ref: TableRef, source: str) -> Any:
    import lance

    try:
        latest = lance.dataset(ref.location)
    except (ValueError, OSError):
        raise InputError(f"no Lance dataset at {ref.location} (no _versions/ there)", where=source) from None
    if ref.version is None:
        return latest
    try:
        return lance.dataset(ref.location, version=int(ref.version))
    except (ValueError, OSError):
        versions = [f"{v['version']} ({v['timestamp']:%Y-%m-%d %H:%M:%S})" for v in latest.versions()][-LATEST_SHOWN:]
        raise _no_version(source, "version", ref.version, versions[::-1]) from None


# -- Hugging Face datasets ---------------------------------------------------------------------
@dataclass(frozen=True)
class _HfFiles:
    """A saved dataset's Arrow files (IPC streams), or the hub's Parquet files, in order."""

    files: list[str]
    table_id: str
    version: str
    schema: Any
    filesystem: Any = None  # huggingface_hub's, for hf:// paths


def _hf_files(ref: TableRef, source: str) -> _HfFiles:
    if ref.location.startswith("hf://"):
        return _hub_files(ref.location)
    path = Path(ref.location)
    if not path.exists():
        raise InputError(f"{path} does not exist", where=source)
    if path.is_file():
        files = [str(path)]
        table_id, version = path.name, f"size {path.stat().st_size}"
    else:
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            if ref.split is None or ref.split not in splits:
                raise InputError(
                    f"{path} holds the splits {', '.join(splits)}: name one, as {path}#{splits[0]}", where=source
                )
            path = path / ref.split
        state = json.loads((path / "state.json").read_text())
        files = [str(path / f["filename"]) for f in state["_data_files"]]
        table_id, version = path.name, str(state.get("_fingerprint"))
    schema = _ipc_stream(files[0]).schema if files else None
    return _HfFiles(files, table_id, version, schema)


def _ipc_stream(path: str) -> Any:
    """A saved dataset's Arrow file, memory-mapped: its batches are read without copying."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(path))


def _hf_batches(hf: _HfFiles, columns: list[str] | None) -> Iterator[Any]:
    if hf.filesystem is not None:
        import pyarrow.parquet as pq

        for name in hf.files:
            with hf.filesystem.open(name, "rb") as f:
                yield from pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH, columns=columns)
        return
    for name in hf.files:
        for batch in _ipc_stream(name):
            yield batch.select(columns) if columns else batch


def _hub_files(uri: str) -> _HfFiles:
    """The Parquet files under an hf:// path, at the revision it resolves to (a thin call into
    huggingface_hub: not tested here, the hub being out of reach)."""
    import pyarrow.parquet as pq
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem()
    resolved = fs.resolve_path(uri)
    files = [uri] if uri.endswith(".parquet") else sorted(fs.glob(uri.rstrip("/") + "/**/*.parquet"))
    with fs.open(files[0], "rb") as f:
        schema = pq.ParquetFile(f).schema_arrow
    return _HfFiles(files, str(getattr(resolved, "repo_id", uri)), str(getattr(resolved, "revision", "")), schema, fs)


def _no_version(source: str, word: str, asked: str, latest: list[str]) -> InputError:
    return InputError(
        f"no {word} {asked} in the table (the latest: {', '.join(latest) or 'none'})",
        where=source,
        hint=f"name one of its {word}s after @, or leave @{asked} out to read the latest",
    )


def _when(milliseconds: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(milliseconds / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# -- incremental reads -------------------------------------------------------------------------
def appended_since(source: SourceFile, since: str, columns: list[str] | None = None) -> Iterator[Any]:
    """The rows appended to an Iceberg or Delta table after snapshot/version `since`, up to the
    version `source` is pinned at (resolve_table), as record batches of the named columns: the
    reuse path's way to read only what is new (issue 34). It reads the data files that the
    commits in between added, nothing else.

    InputError when `since` does not exist, is not an ancestor of the pinned version, when a
    commit in between did more than append (an overwrite, a delete: rows changed, so "what is new"
    is not a set of added rows; read the whole table), or when the named columns changed type
    or went away in between. Rows come in scan order of the added files; their positions in the
    whole table are those after the rows of `since` only for tables that were only appended to."""
    ref = parse_table(source.uri)
    ref = TableRef(ref.kind, ref.location, source.version, ref.catalog, ref.properties, ref.split)
    if ref.kind == "iceberg":
        yield from _iceberg_appended(ref, source.uri, since, columns)
    elif ref.kind == "delta":
        yield from _delta_appended(ref, source.uri, since, columns)
    else:
        raise InputError(f"{source.uri}: incremental reads are for Iceberg and Delta tables, not {ref.kind}")


def _same_columns(source: str, since: str, then: Any, now: Any, columns: list[str] | None) -> None:
    names = columns or [f.name for f in now]
    changed = [n for n in names if n not in then.names or n not in now.names or then.field(n).type != now.field(n).type]
    if changed:
        raise InputError(
            f"the schema changed since {since}: column(s) {', '.join(changed)} differ "
            f"(then: {', '.join(f'{f.name}: {f.type}' for f in then)})",
            where=source,
            hint="read the whole table (no incremental read across a schema change)",
        )


def _iceberg_appended(ref: TableRef, source: str, since: str, columns: list[str] | None) -> Iterator[Any]:
    from pyiceberg.manifest import ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation

    table = _iceberg_table(ref, source)
    now = _iceberg_snapshot(ref, table, source)
    then = _iceberg_snapshot(TableRef(ref.kind, ref.location, since), table, source)
    _same_columns(source, since, _schema(TableRef(ref.kind, ref.location, since), table), _schema(ref, table), columns)
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
    yield from _iceberg_rows(table, now, columns, added)


def _delta_appended(ref: TableRef, source: str, since: str, columns: list[str] | None) -> Iterator[Any]:
    now = _delta_table(ref, source)
    then = _delta_table(TableRef(ref.kind, ref.location, since), source)
    if int(since) > now.version():
        raise InputError(f"version {since} is after version {now.version()}, the one read", where=source)
    _same_columns(source, since, _schema(ref, then), _schema(ref, now), columns)
    before = set(then.get_add_actions(flatten=True).column("path").to_pylist())
    after = now.get_add_actions(flatten=True).column("path").to_pylist()
    if before - set(after):
        raise InputError(
            f"{len(before - set(after))} data file(s) of version {since} are gone by version {now.version()}: "
            "rows changed, not only appended",
            where=source,
            hint="read the whole table",
        )
    yield from _delta_rows(now, columns, set(after) - before)

"""Table sources: Apache Iceberg, Delta Lake, Lance and Hugging Face datasets, read at one pinned version as record batches.

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
            f"column(s) {', '.join(missing)} not in the table (it has: {', '.join(names)}{close_names(missing, names)})",
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
        f" (a new {word} is new input: prepare it under a new --run, or read the prepared one with @{then.get('version')})"
    ]
    before, after = list(then.get("columns") or []), list(now.columns)
    if before and before != after:
        removed = [c for c in before if c not in after]
        added = [c for c in after if c not in before]
        out.append(
            f"{now.uri}: the schema changed between them: "
            + "; ".join(
                ([f"removed {', '.join(removed)}"] if removed else []) + ([f"added {', '.join(added)}"] if added else [])
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
            yield from _iceberg_scan(opened, snapshot, columns).to_arrow_batch_reader()
    elif ref.kind == "delta":
        yield from opened.to_pyarrow_dataset().to_batches(columns=columns, batch_size=PARQUET_BATCH)
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
                f"no namespace {namespace!r} in Iceberg catalog {ref.catalog!r} (it has: {', '.join(spaces) or 'none'})",
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
            if ref.split not in splits:
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
    files = sorted(fs.glob(uri.rstrip("/") + "/**/*.parquet")) if fs.isdir(uri) else [uri]
    with fs.open(files[0], "rb") as f:
        schema = pq.ParquetFile(f).schema_arrow
    return _HfFiles(files, resolved.repo_id, str(resolved.revision), schema, fs)


def _no_version(source: str, word: str, asked: str, latest: list[str]) -> InputError:
    return InputError(
        f"no {word} {asked} in the table (the latest: {', '.join(latest) or 'none'})",
        where=source,
        hint=f"name one of its {word}s after @, or leave @{asked} out to read the latest",
    )


def _when(milliseconds: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(milliseconds / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


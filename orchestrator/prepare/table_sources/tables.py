"""Table sources: Iceberg, Delta Lake, Lance and Hugging Face datasets, read at one pinned version as record batches.

The forms a source takes (docs/tables.md):
    iceberg://CATALOG/NAMESPACE.TABLE[@SNAPSHOT][?PROPERTY=VALUE&...]
        a catalog pyiceberg's configuration names (~/.pyiceberg.yaml, PYICEBERG_CATALOG__* variables),
        or whose properties the query gives (`?type=sql&uri=sqlite:///c.db&warehouse=file:///wh`)
    delta:PATH[@VERSION]       or a directory holding _delta_log/ (PATH may be s3://...)
    lance:PATH[@VERSION]       or a directory holding _versions/ (a `.lance` dataset; PATH may be s3://...)
    hf:PATH[#SPLIT]            or a folder `datasets` saved with save_to_disk, or one of its .arrow files
    hf://datasets/ORG/NAME[@REVISION][/PATH]   the hub's Parquet files, through huggingface_hub's filesystem
A table is resolved once, to the version it is read at (the latest unless `@` names one), and that
version is its identity: the same command twice is a no-op, a new snapshot is new input. Rows are
numbered 0, 1, ... in the order a scan of that version gives them, as with Parquet files.
On S3 each library gets the endpoint and region from the environment (table_ref.s3_settings).
The forms and the S3 settings are parsed in table_ref.py; Iceberg and Delta are read in table_lake.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import InputError
from orchestrator.prepare.formats import close_names
from orchestrator.prepare.source_file import PARQUET_BATCH, SourceFile, read_ahead
from orchestrator.prepare.table_sources.table_lake import (
    delta_appended,
    delta_pinned,
    delta_rows,
    delta_schema,
    delta_table,
    iceberg_appended,
    iceberg_catalog,
    iceberg_pinned,
    iceberg_rows,
    iceberg_schema,
    iceberg_snapshot,
    iceberg_table,
)
from orchestrator.prepare.table_sources.table_ref import (
    LATEST_SHOWN,
    TableRef,
    no_version,
    parse_table,
    s3_settings,
    table_kind,
)

__all__ = [
    "TableRef",
    "appended_since",
    "iceberg_catalog",
    "parse_table",
    "resolve_table",
    "table_batches",
    "table_differences",
    "table_digest",
    "table_identity",
    "table_kind",
]


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
    yield from read_ahead(_sliced(_batches(ref, opened, columns)))


def _sliced(batches: Iterator[Any]) -> Iterator[Any]:
    """Batches of at most PARQUET_BATCH rows (zero-copy slices): pyiceberg's scan yields 131,072 rows
    at a time, which the rows' conversion then walks with a cold cache, and no overlap with decoding."""
    for batch in batches:
        for start in range(0, batch.num_rows, PARQUET_BATCH):
            yield batch.slice(start, PARQUET_BATCH)


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
        return iceberg_table(ref, source)
    if ref.kind == "delta":
        return delta_table(ref, source)
    if ref.kind == "lance":
        return _lance_dataset(ref, source)
    return _hf_files(ref, source)


def _pinned(ref: TableRef, opened: Any, source: str) -> tuple[str, str, int]:
    """(version, table id, rows) of what will be read."""
    if ref.kind == "iceberg":
        return iceberg_pinned(ref, opened, source)
    if ref.kind == "delta":
        return delta_pinned(opened)
    if ref.kind == "lance":
        created = {v["version"]: v["timestamp"] for v in opened.versions()}.get(opened.version)
        return str(opened.version), f"created {created}", int(opened.count_rows())
    return opened.version, opened.table_id, sum(b.num_rows for b in _hf_batches(opened, None))


def _schema(ref: TableRef, opened: Any) -> Any:
    """The table's Arrow schema at the pinned version."""
    if ref.kind == "iceberg":
        return iceberg_schema(ref, opened)
    if ref.kind == "delta":
        return delta_schema(opened)
    return opened.schema


def _batches(ref: TableRef, opened: Any, columns: list[str] | None) -> Iterator[Any]:
    if ref.kind == "iceberg":
        snapshot = iceberg_snapshot(ref, opened, ref.location)
        if snapshot is not None:
            yield from iceberg_rows(opened, snapshot, columns, None)
    elif ref.kind == "delta":
        yield from delta_rows(opened, columns, None)
    elif ref.kind == "lance":
        yield from opened.to_batches(columns=columns, batch_size=PARQUET_BATCH, scan_in_order=True)
    else:
        yield from _hf_batches(opened, columns)


# -- Lance -------------------------------------------------------------------------------------
def _lance_dataset(ref: TableRef, source: str) -> Any:
    import lance

    try:
        latest = lance.dataset(ref.location, storage_options=s3_settings("lance", ref.location))
    except (ValueError, OSError):
        raise InputError(f"no Lance dataset at {ref.location} (no _versions/ there)", where=source) from None
    if ref.version is None:
        return latest
    try:
        return lance.dataset(ref.location, version=int(ref.version), storage_options=s3_settings("lance", ref.location))
    except (ValueError, OSError):
        versions = [f"{v['version']} ({v['timestamp']:%Y-%m-%d %H:%M:%S})" for v in latest.versions()][-LATEST_SHOWN:]
        raise no_version(source, "version", ref.version, versions[::-1]) from None


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
        yield from iceberg_appended(ref, source.uri, since, columns)
    elif ref.kind == "delta":
        yield from delta_appended(ref, source.uri, since, columns)
    else:
        raise InputError(f"{source.uri}: incremental reads are for Iceberg and Delta tables, not {ref.kind}")

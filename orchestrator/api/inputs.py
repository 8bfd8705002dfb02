"""Data a Python caller hands over (a DataFrame, a table, rows) as a run's input file in the store.

What `orch prepare` reads (a path, a table URI) goes to prepare as it is. Data held in memory would
die with its kernel, so it is written as a file into the run's own place in the store
(`RunLayout.handed_input`): a table as Parquet, rows as JSONL. Prepare reads it from there, like
any input; `attach` from another kernel or machine, and collect's kept columns, find it again.

Handing the same data to the same run again is the same input: the stored file is kept (compared
by its bytes, or by value for a table, so a file written by another pyarrow still matches), and
prepare sees the input it prepared. Different data for a prepared run is refused, as prepare
refuses a different file.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.records import PrepareRecord
from orchestrator.core.records.base import read_record
from orchestrator.core.store.local import LocalStore

if TYPE_CHECKING:
    import pyarrow as pa

#: What `data` may be, in words, for errors.
ACCEPTED = (
    "a pandas or polars DataFrame, a pyarrow Table, a Hugging Face Dataset, an iterable of dicts, "
    "or what `orch prepare` reads (a path, a table URI, or a list of them)"
)


@dataclass(frozen=True)
class HandedInput:
    """In-memory data as the bytes of an input file."""

    #: The file's name in the run's input folder: `data.parquet` (a table) or `rows.jsonl` (rows).
    name: str
    content: bytes
    rows: int
    #: What identifies the rows, whatever wrote the file (a table's Arrow IPC stream, without
    #: metadata; the JSONL lines of rows): the default run name is made from it.
    digest: str
    #: The table, to compare with a stored copy by value (None for rows).
    table: pa.Table | None = None


def source_paths(data: Any) -> list[str] | None:
    """What prepare reads itself (a path or table URI, or a list of them), else None."""
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)]
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data):
        return [os.fspath(d) for d in data]
    return None


def handed_input(data: Any) -> HandedInput:
    """The data as an input file: a table (pandas, polars, pyarrow, Hugging Face) as Parquet, an
    iterable of dicts as JSONL lines (their values as JSON has them, as a JSONL file would give)."""
    table = as_arrow(data)
    if table is not None:
        return _table_file(table)
    if isinstance(data, (bytes, Mapping)) or not isinstance(data, Iterable):
        raise InputError(f"cannot read a {type(data).__name__} as input rows", hint=f"give {ACCEPTED}")
    return _rows_file(data)


def as_arrow(data: Any) -> pa.Table | None:
    """A table-shaped object as an Arrow table (None for anything else); its libraries are imported
    only when the object is theirs."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    library = type(data).__module__.split(".")[0]
    try:
        if library == "pandas" and hasattr(data, "columns"):
            return pa.Table.from_pandas(data, preserve_index=False)
        if library == "polars" and hasattr(data, "to_arrow"):
            return data.to_arrow()
        if library == "polars" and hasattr(data, "collect"):  # a LazyFrame
            return data.collect().to_arrow()
        if library == "datasets" and hasattr(data, "with_format"):
            if hasattr(data, "keys"):  # a DatasetDict
                raise InputError(
                    f"a DatasetDict holds several splits ({', '.join(data.keys())})",
                    hint="pass one of them, e.g. data['train']",
                )
            return data.with_format("arrow")[:]
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InputError(
            f"the {type(data).__name__} cannot be written as a table: {e}",
            hint="give each column one type (a column of mixed values can be cast to str)",
        ) from None
    return None


def _table_file(table: pa.Table) -> HandedInput:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _canonical(table)
    stream = io.BytesIO()
    with pa.ipc.new_stream(stream, table.schema) as ipc:
        ipc.write_table(table)
    content = io.BytesIO()
    pq.write_table(table, content)
    digest = hashlib.sha256(stream.getvalue()).hexdigest()
    return HandedInput("data.parquet", content.getvalue(), table.num_rows, digest, table)


def _canonical(table: pa.Table) -> pa.Table:
    """The same rows as the same table, whichever library held them: without the writers' metadata
    (pandas' index, versions), and text as Arrow's plain strings (pandas and polars hold it as large
    strings or string views)."""
    import pyarrow as pa

    plain = {pa.large_string(): pa.string(), pa.string_view(): pa.string(), pa.large_binary(): pa.binary()}
    schema = pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema])
    return table.replace_schema_metadata(None).cast(schema)


def _rows_file(rows: Iterable[Any]) -> HandedInput:
    import orjson

    lines = []
    for number, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InputError(
                f"row {number} is a {type(row).__name__}: the rows of an iterable are dicts (column -> value)",
                hint=f"give {ACCEPTED}",
            )
        try:
            lines.append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
        except TypeError as e:
            raise InputError(f"row {number} cannot be written as JSON: {e}", hint="give values JSON can hold") from None
    content = b"".join(line + b"\n" for line in lines)
    return HandedInput("rows.jsonl", content, len(lines), hashlib.sha256(content).hexdigest())


def store_input(ctx: RunContext, handed: HandedInput) -> str:
    """The data written into the run's input folder (kept when the same data is there already);
    returns the URI prepare reads it from. A prepared run takes only the data it was prepared
    from: other data is refused, saying what the run was prepared from."""
    key = ctx.layout.handed_input(handed.name)
    uri = _object_uri(ctx, key)
    prepared = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    if _same_as_stored(ctx, key, handed):
        return uri
    if prepared is not None:
        sources = prepared[0].identity.get("sources", [])
        was = ", ".join(str(s.get("name") or s.get("uri")) for s in sources) or "nothing"
        raise InputError(
            f"run {ctx.layout.run!r} was prepared from other data ({was}, {prepared[0].rows:,} rows); "
            f"this {handed.rows:,}-row input is not it",
            where=ctx.layout.prepare_record,
            hint="name a new run (run=...), or leave run= out: a run is then named after its data and options",
        )
    ctx.store.put(key, handed.content)  # a prepare that failed made nothing from an earlier copy
    return uri


def _same_as_stored(ctx: RunContext, key: str, handed: HandedInput) -> bool:
    """The run's input folder holds this data already: the same bytes, or for a table the same
    rows and columns (a file another pyarrow wrote)."""
    if ctx.store.head(key) is None:
        return False
    stored = ctx.store.get(key).data
    if stored == handed.content:
        return True
    if handed.table is None:
        return False
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return bool(_canonical(pq.read_table(io.BytesIO(stored))).equals(handed.table))
    except pa.ArrowException:
        return False


def _object_uri(ctx: RunContext, key: str) -> str:
    """Where prepare reads an object of the run's store from: its path in a directory store, its
    URI (with the store's endpoint settings) in a bucket."""
    store = ctx.store
    if isinstance(store, LocalStore):
        return str((store.root / key).absolute())
    if store.shared:
        base, _, query = ctx.spec.store.partition("?")
        return f"{base.rstrip('/')}/{key}" + (f"?{query}" if query else "")
    raise InputError(
        f"data held in memory is written into the run's store, and {store.uri} is not one prepare can read",
        hint="use a directory store or s3://BUCKET/PREFIX, r2://BUCKET/PREFIX",
    )

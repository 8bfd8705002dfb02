"""Input datasets: local or S3/R2 files (.jsonl, .jsonl.gz, .parquet), directories of them, or tables, streamed.

Rows come out numbered as a user would find them again: the 1-based line of a JSONL file, the
0-based row of a Parquet file. A line longer than `input.max_line_bytes` is never held whole: it
is skipped to its newline and comes back as a problem row with its size; a file pyarrow cannot
read is an InputError naming it. Tables (Iceberg, Delta Lake, Lance, Hugging Face datasets) are
read as record batches by tables.py, numbered like Parquet rows.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlparse

from orchestrator.core.errors import InputError
from orchestrator.core.spec import MAX_LINE_BYTES
from orchestrator.core.store import Store
from orchestrator.prepare.formats import close_names
from orchestrator.prepare.source_file import (
    COLUMNAR_KINDS,
    PARQUET_BATCH,
    SUFFIXES,
    TABLE_KINDS,
    SourceFile,
    read_ahead,
)

#: Arrays and objects within each other that a line may hold: about where pydantic's JSON parser
#: (vLLM's run_batch reads its lines with it) stops, far below where Python's json and orjson
#: run out of recursion, so nothing that walks a row later (encoding, hashing) can.
MAX_JSON_DEPTH = 200
#: How much of a line too long to read is kept, to show which line it was.
HEAD_BYTES = 200


def content_digest(source: SourceFile) -> str:
    """What identifies the file's content, wherever it is read from: the SHA-256 of a local file's
    bytes (a pass at disk speed, far faster than converting its rows), or the object store's ETag;
    a table's id and version."""
    if source.kind in TABLE_KINDS:
        from orchestrator.prepare.table_sources.tables import table_digest

        return table_digest(source)
    if source.etag is not None:
        return "etag:" + source.etag.strip('"')
    digest = hashlib.sha256()
    with _open_bytes(source) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


@dataclass
class RawRow:
    """A row as read: `record` is None when the line could not be parsed (`problem` says why).
    `replaced`: bytes of the line that were not UTF-8, read as U+FFFD."""

    number: int
    record: dict[str, Any] | None
    raw: str
    problem: str | None = None
    replaced: int = 0
    #: The size of a line too long to read (input.max_line_bytes): `raw` is then only its start.
    too_long: int | None = None


def resolve_sources(sources: list[str]) -> list[SourceFile]:
    """Expand directories and prefixes into files, in name order, and check each one exists."""
    if not sources:
        raise InputError("no input given", hint="orch prepare PATH_OR_URI ... (a file, a directory, or s3://...)")
    files: list[SourceFile] = []
    from orchestrator.prepare.table_sources.tables import resolve_table, table_kind

    for source in sources:
        if table_kind(source) is not None:
            files.append(resolve_table(source))
            continue
        found = _resolve_remote(source) if _is_remote(source) else _resolve_local(source)
        if not found:
            raise InputError(f"no .jsonl, .jsonl.gz or .parquet files in {source}", where=source)
        files.extend(found)
    return files


def count_rows(source: SourceFile, max_line_bytes: int = MAX_LINE_BYTES) -> int:
    """Rows in the file: Parquet metadata (free), a table's (counted when resolved), or a pass over
    the lines of a JSONL file."""
    if source.kind in TABLE_KINDS:
        return source.size
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        with _local_copy(source) as path, _parquet_errors(source):
            return int(pq.ParquetFile(path).metadata.num_rows)
    count = 0
    with _open_text_bytes(source) as f:
        for _number, line, too_long in read_lines(f, max_line_bytes):
            if too_long is not None or line.strip():
                count += 1
    return count


#: A line as `read_lines` gives it: its 1-based number; its bytes, newline included (only its first
#: HEAD_BYTES when it is too long); and the size in bytes (newline not counted) of a line over the
#: limit, else None. A plain tuple: a named one costs a microsecond a line, a tenth of prepare's time.
Line = tuple[int, bytes, int | None]


def read_lines(f: BinaryIO, max_bytes: int) -> Iterator[Line]:
    """The file's lines, none longer than `max_bytes` (its newline not counted) held in memory:
    a longer one is read past in 1 MiB pieces and given as its size and its first bytes."""
    readline, number = f.readline, 0
    while data := readline(max_bytes + 1):
        number += 1
        if len(data) <= max_bytes or data.endswith(b"\n"):
            yield number, data, None
            continue
        size, head = len(data), data[:HEAD_BYTES]
        del data  # the limit's worth of bytes, freed before reading on
        while (rest := readline(1 << 20)) and not rest.endswith(b"\n"):
            size += len(rest)
        size += len(rest.rstrip(b"\r\n"))
        yield number, head, size


def line_too_long(size: int, max_bytes: int) -> str:
    """What is wrong with a line over the limit, for prepare's errors file."""
    return f"the line is {size:,} bytes, over the {max_bytes:,}-byte limit (input.max_line_bytes): skipped unread"


def iter_rows(
    source: SourceFile, columns: list[str] | None = None, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[RawRow]:
    """Every row of the file, streamed. JSONL lines that are not a JSON object, or too long to
    read, come back as problems."""
    if source.kind in COLUMNAR_KINDS:
        yield from _parquet_rows(source, columns)
        return
    with _open_text_bytes(source) as f:
        for number, line, too_long in read_lines(f, max_line_bytes):
            if too_long is not None:
                head = line.decode("utf-8", errors="replace")
                yield RawRow(number, None, head, line_too_long(too_long, max_line_bytes), too_long=too_long)
                continue
            if not line.strip():
                continue
            replaced = 0
            try:
                text = line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                replaced = _invalid_utf8_bytes(line)
            try:
                record = loads_json(text)
            except ValueError as e:
                yield RawRow(number, None, text, f"not valid JSON: {e}", replaced)
                continue
            if not isinstance(record, dict):
                yield RawRow(number, None, text, "a line must be a JSON object", replaced)
                continue
            yield RawRow(number, record, text, None, replaced)


def loads_json(text: str | bytes) -> Any:
    """JSON text read as JSON is written: Python's json also reads NaN, Infinity and -Infinity,
    and a row holding one would reach the engine changed (written out again, a NaN is null, the
    parameter's default). ValueError for them, as for any other text that is not JSON; and for
    text nested deeper than MAX_JSON_DEPTH, or holding a lone surrogate escape (`"\\ud800"`),
    which JSON's grammar allows but no UTF-8 text can hold, so the row could not be written out."""
    if isinstance(text, bytes):  # decoded as json.loads decodes bytes, but strictly: no surrogate passes
        text = text.decode(json.detect_encoding(text))
    if text.startswith("\ufeff"):  # what json.loads says of it
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(_too_deep()) from None
    # Walked only when it could be either: so many brackets, or an escape in the surrogate range.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(text):
        _check_parsed(value)
    return value


#: A `\\uD800`-`\\uDFFF` escape: half of a pair, or a lone surrogate. (A regular expression that
#: starts with a literal is searched for at the speed of `in`; one with an alternative is not.)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_parsed(value: Any) -> None:
    """ValueError for a value nested deeper than MAX_JSON_DEPTH or holding a lone surrogate, found
    without recursion (a stack of the containers still to look at)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            strings: Any = (*item.keys(), *(v for v in item.values() if isinstance(v, str)))
            children = [v for v in item.values() if isinstance(v, (dict, list))]
        elif isinstance(item, list):
            strings = [v for v in item if isinstance(v, str)]
            children = [v for v in item if isinstance(v, (dict, list))]
        else:
            strings, children = [item] if isinstance(item, str) else [], []
        for string in strings:
            if found := _LONE_SURROGATE.search(string):
                raise ValueError(
                    f"a lone surrogate escape \\u{ord(found.group()):04x} (half of a UTF-16 pair) in {string[:40]!r}: "
                    "JSON text must be valid Unicode"
                )
        if children and depth >= MAX_JSON_DEPTH:
            raise ValueError(_too_deep())
        stack.extend((child, depth + 1) for child in children)


def _too_deep() -> str:
    return f"arrays and objects nested more than {MAX_JSON_DEPTH} levels deep"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or Infinity: write a number, or null)")


#: One decoder for every line: `json.loads` with an argument builds a new one per call, an eighth
#: of the time a line takes to read.
_DECODER = json.JSONDecoder(parse_constant=_not_json)


def _invalid_utf8_bytes(line: bytes) -> int:
    """How many bytes of the line are not UTF-8 (each became one U+FFFD or part of one)."""
    count, rest = 0, line
    while rest:
        try:
            rest.decode("utf-8")
            break
        except UnicodeDecodeError as e:
            count += e.end - e.start
            rest = rest[e.end :]
    return count


def parquet_batches(source: SourceFile, columns: list[str] | None) -> Iterator[Any]:
    """Record batches of a Parquet file or a table (only the named columns), for vectorised formats."""
    import pyarrow.parquet as pq

    if source.kind in TABLE_KINDS:
        from orchestrator.prepare.table_sources.tables import appended_since, table_batches

        yield from (
            table_batches(source, columns) if source.since is None else appended_since(source, source.since, columns)
        )
        return

    with _local_copy(source) as path:
        with _parquet_errors(source):
            parquet = pq.ParquetFile(path)
        missing = [c for c in columns or [] if c not in parquet.schema_arrow.names]
        if missing:
            raise InputError(
                f"column(s) {', '.join(missing)} not in the file (it has: {', '.join(parquet.schema_arrow.names)}"
                f"{close_names(missing, parquet.schema_arrow.names)})",
                where=source.uri,
                hint="name the right columns: --id-column, --conversation-column, --text-column (input.* in orch.yaml)",
            )
        rows = 0
        with _parquet_errors(source, lambda: rows):
            for batch in read_ahead(parquet.iter_batches(batch_size=PARQUET_BATCH, columns=columns)):
                yield batch
                rows += batch.num_rows


@contextlib.contextmanager
def _parquet_errors(source: SourceFile, rows_read: Callable[[], int] | None = None) -> Iterator[None]:
    """pyarrow's errors on a file that is not Parquet, or is damaged, as an InputError naming it
    (and the rows read before the damage)."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as e:
        after = f" after its first {rows_read():,} row(s)" if rows_read is not None else ""
        raise InputError(
            f"cannot read the file as Parquet{after}: {' '.join(str(e).split())}",
            where=source.uri,
            hint="is it a whole .parquet file? Write it again, or leave it out of the inputs",
        ) from None


def parquet_first_user_turns(source: SourceFile, conversation: str, id_column: str | None) -> Iterator[RawRow]:
    """Rows reduced to their first user turn, picked with Arrow compute: the rest of each
    conversation (long assistant answers) is never turned into Python objects. A row without a
    user turn keeps an empty conversation, which the converter reports as a bad row. A column of
    another type (strings, say) is read row by row instead, each row then set aside saying why."""
    number = 0
    for batch in parquet_batches(source, [conversation, *([id_column] if id_column else [])]):
        if _holds_turns(batch.schema.field(conversation).type):
            records = _first_turns(batch, conversation, id_column)
        else:
            records = batch.to_pylist()
        for record in records:
            yield RawRow(number, record, "")
            number += 1


def _first_turns(batch: Any, conversation: str, id_column: str | None) -> list[dict[str, Any]]:
    """The batch's rows, each with its conversation reduced to its first user turn."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    turns = batch.column(conversation)
    flat = pc.list_flatten(turns)
    parents = pc.list_parent_indices(turns).to_numpy()
    is_user = pc.fill_null(pc.equal(pc.struct_field(flat, "role"), "user"), False).to_numpy(zero_copy_only=False)
    user_at = np.nonzero(is_user)[0]
    rows_with_user, first = np.unique(parents[user_at], return_index=True)
    contents = pc.struct_field(flat, "content").take(pa.array(user_at[first])).to_pylist()
    first_turn: list[list[dict[str, Any]]] = [[] for _ in range(batch.num_rows)]
    for row, content in zip(rows_with_user.tolist(), contents, strict=True):
        first_turn[row] = [{"role": "user", "content": content}]
    records: list[dict[str, Any]] = [{conversation: turn} for turn in first_turn]
    if id_column is not None:
        for record, value in zip(records, batch.column(id_column).to_pylist(), strict=True):
            record[id_column] = value
    return records


def _holds_turns(kind: Any) -> bool:
    """Whether an Arrow type is a list of structs with `role` and `content` fields: the shape
    Arrow compute picks first turns from."""
    import pyarrow as pa

    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return False
    return {"role", "content"} <= {field.name for field in kind.value_type}


def _parquet_rows(source: SourceFile, columns: list[str] | None) -> Iterator[RawRow]:
    number = 0
    for batch in parquet_batches(source, columns):
        for record in batch.to_pylist():
            yield RawRow(number, record, "")
            number += 1


# -- local files ------------------------------------------------------------------------------
def _resolve_local(source: str) -> list[SourceFile]:
    path = Path(source.removeprefix("file://"))
    if path.is_dir():
        return [_local_file(p) for p in sorted(path.iterdir()) if p.is_file() and _kind(p.name)]
    if not path.exists():
        raise InputError(
            f"{path} does not exist",
            where=source,
            hint="SOURCES are .jsonl, .jsonl.gz or .parquet files, directories of them, or s3:// prefixes",
        )
    if not _kind(path.name):
        raise InputError(f"{path.name}: not a .jsonl, .jsonl.gz or .parquet file", where=source)
    return [_local_file(path)]


def _local_file(path: Path) -> SourceFile:
    return SourceFile(str(path), path.name, _kind(path.name) or "", path.stat().st_size)


def _kind(name: str) -> str | None:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return suffix.lstrip(".")
    return None


# -- S3 and R2 -------------------------------------------------------------------------------
def _is_remote(source: str) -> bool:
    return source.startswith(("s3://", "r2://"))


def _bucket_store(source: str) -> tuple[Store, str]:
    """A store at the bucket's root, with the endpoint settings of the URI (query or environment)."""
    from orchestrator.core.store.s3 import from_uri

    parsed = urlparse(source)
    query = f"?{parsed.query}" if parsed.query else ""
    return from_uri(f"{parsed.scheme}://{parsed.netloc}{query}"), parsed.path.lstrip("/")


def _resolve_remote(source: str) -> list[SourceFile]:
    store, key = _bucket_store(source)
    if _kind(key):
        info = store.head(key)
        if info is None:
            raise InputError(f"no object at {source}", where=source)
        return [_remote_file(source, key, info.size, info.etag)]
    prefix = key.rstrip("/") + "/" if key else ""
    found = sorted((o for o in store.list(prefix) if _kind(o.key)), key=lambda o: o.key)
    base = source.split("?", 1)[0].rstrip("/")
    query = source[len(source.split("?", 1)[0]) :]
    return [_remote_file(f"{base}/{o.key[len(prefix) :]}{query}", o.key, o.size, o.etag) for o in found]


def _remote_file(uri: str, key: str, size: int, etag: str | None) -> SourceFile:
    name = key.rsplit("/", 1)[-1]
    # An object store without ETags in its listings is read like a file to be identified.
    return SourceFile(uri, name, _kind(name) or "", size, etag or None)


# -- opening ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _open_bytes(source: SourceFile) -> Iterator[BinaryIO]:
    if _is_remote(source.uri):
        store, key = _bucket_store(source.uri)
        with store.open(key) as f:
            yield f
    else:
        with open(source.uri, "rb") as f:
            yield f


@contextlib.contextmanager
def _open_text_bytes(source: SourceFile) -> Iterator[BinaryIO]:
    """The file's decompressed bytes, line-iterable."""
    with _open_bytes(source) as raw:
        if source.kind == "jsonl.gz":
            with gzip.open(raw) as f:
                yield io.BufferedReader(f, 1 << 20)
        else:
            yield raw


@contextlib.contextmanager
def _local_copy(source: SourceFile) -> Iterator[str]:
    """A seekable local path (Parquet needs one): the file itself, or a temporary download."""
    if not _is_remote(source.uri):
        yield source.uri
        return
    fd, path = tempfile.mkstemp(suffix=".parquet")
    try:
        with os.fdopen(fd, "wb") as out, _open_bytes(source) as src:
            shutil.copyfileobj(src, out, 1 << 20)
        yield path
    finally:
        os.unlink(path)

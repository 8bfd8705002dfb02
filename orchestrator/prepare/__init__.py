"""`orch prepare`: stream a dataset into chunks of canonical requests, a manifest and metadata.txt.

1. Resolve the sources and count their rows (Parquet metadata; one pass over JSONL lines).
2. Stream rows through the format's converter; good requests fill chunk files (local temp files,
   uploaded as each one closes), bad rows go to the errors file (or stop everything with --strict).
3. Write the errors file, manifest.jsonl, metadata.txt, and last the prepare record. A run with a
   prepare record is prepared: running the same command again changes nothing, and a different
   input on the same run is refused. A prepare that died before its record is simply redone: the
   same input gives byte-identical chunks.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.pools import model_names
from orchestrator.core.records import ManifestEntry, PrepareRecord, read_jsonl, read_record, write_jsonl
from orchestrator.core.spec import DEFAULT_ROWS_PER_CHUNK, ChunkingSpec, InputSpec
from orchestrator.prepare.formats import BadRow, Converter, Request, make_converter, needed_columns
from orchestrator.prepare.grouping import PrefixSorter
from orchestrator.prepare.pools import MODEL_NOT_FOUND, ModelRouter, PoolSorters
from orchestrator.prepare.sources import (
    RawRow,
    SourceFile,
    content_digest,
    count_rows,
    iter_rows,
    parquet_first_user_turns,
    resolve_sources,
)
from orchestrator.prepare.sweep import Arm, sweep_arms
from orchestrator.prepare.writers import ChunkWriter, ErrorWriter

Progress = Callable[[str], None]


@dataclass
class PrepareReport:
    """What one prepare call found or made: the run's prepare record, and how long the call took."""

    run: str
    record: PrepareRecord
    already_prepared: bool
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.record.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as `orch prepare --json` prints it: the record's counts, not its input identity."""
        counts = self.record.model_dump(mode="json", exclude={"identity", "created_at"})
        return {
            "run": self.run,
            **counts,
            "already_prepared": self.already_prepared,
            "seconds": self.seconds,
            "rows_per_s": round(self.rows_per_s, 1),
        }


def prepare_run(
    ctx: RunContext, sources: list[str], *, strict: bool = False, progress: Progress = lambda _line: None
) -> PrepareReport:
    started = time.monotonic()
    spec, layout = ctx.spec, ctx.layout
    files = resolve_sources(sources)
    done = _existing_record(ctx)
    if done is not None:
        return _already_prepared(ctx, done, files, started)
    if spec.chunking.num_chunks is None and spec.chunking.rows_per_chunk is None:
        # Recorded with the spec when the prepare succeeds, so later commands chunk alike.
        spec.chunking.rows_per_chunk = DEFAULT_ROWS_PER_CHUNK
        progress(f"no chunking given: chunks of {DEFAULT_ROWS_PER_CHUNK:,} rows (--rows-per-chunk K or --num-chunks N)")

    total = sum(count_rows(f, spec.input.max_line_bytes) for f in files)
    if total == 0:
        # As vLLM's run_batch and OpenAI's Batch API do: an empty input is an empty run, not an error.
        progress(
            f"WARNING: the input has no rows ({', '.join(f.uri for f in files)}): nothing to run, the output is empty"
        )
    errors = ErrorWriter(strict, several_files=len(files) > 1)
    pooled = bool(spec.models or spec.sweep.arms)
    sorter = PrefixSorter(spec.chunking.prefix_chars) if spec.chunking.group_by_prefix and not pooled else None
    writer: ChunkWriter | None = None
    try:
        if pooled:
            writer, rows_in = _pooled_chunks(ctx, files, total, errors, strict, progress)
        elif sorter is None:
            writer = ChunkWriter(ctx, _chunk_boundaries(spec.chunking, total))
            progress(f"{total:,} rows in {len(files)} file(s) -> {writer.total} chunks")
            rows_in = _Conversion(ctx, files, writer.add, errors, strict)
            _convert_rows(files, spec.input, total, writer.advance_to, rows_in, progress)
            writer.advance_to(total)
        else:
            progress(f"{total:,} rows in {len(files)} file(s), grouped by prompt prefix")
            rows_in = _Conversion(ctx, files, sorter.add, errors, strict)
            _convert_rows(files, spec.input, total, lambda _row: None, rows_in, progress)
            writer = ChunkWriter(ctx, _chunk_boundaries(spec.chunking, max(sorter.count, 1)), grouped=True)
            writer.write_sorted(sorter.sorted_rows())
        entries = writer.close()
        if not entries and total > 0:
            missing_column = bool(errors.first) and ": no column " in errors.first[0]
            raise InputError(
                f"no row of the input became a request: all {errors.count:,} row(s) were set aside",
                where=errors.first[0] if errors.first else None,
                hint=(
                    "name the column (--conversation-column for chat turns, --text-column for text), or read "
                    "the rows as text: --format text --text-column COLUMN"
                    if missing_column
                    else "fix the input or how it is read (--format, --template, --id-column, ...), then prepare again"
                ),
            )
        identity = _identity(ctx, files)
        # Recorded only now: a prepare that failed leaves the run's spec free to be corrected.
        ctx.freeze()
        errors_key = errors.upload(ctx)
    finally:
        if writer is not None:
            writer.discard()
        if sorter is not None:
            sorter.discard()
        errors.discard()
    record = _record_prepare(ctx, entries, identity, errors, errors_key, rows_in)
    return PrepareReport(layout.run, record, already_prepared=False, seconds=time.monotonic() - started)


def _pooled_chunks(
    ctx: RunContext, files: list[SourceFile], total: int, errors: ErrorWriter, strict: bool, progress: Progress
) -> tuple[ChunkWriter, _Conversion]:
    """Several models, or a sweep: rows held per model, then chunks cut per model (prepare/pools.py)."""
    spec = ctx.spec
    pools = PoolSorters(list(spec.models) or [""], spec.chunking)
    try:
        arms = f" x {len(spec.sweep.arms)} arms" if spec.sweep.arms else ""
        progress(f"{total:,} rows{arms} in {len(files)} file(s), for {len(pools.order)} model(s)")
        rows_in = _Conversion(ctx, files, pools.add, errors, strict)
        _convert_rows(files, spec.input, total, lambda _row: None, rows_in, progress)
        writer = ChunkWriter(ctx, pools.boundaries(), grouped=True, by_prefix=spec.chunking.group_by_prefix)
        try:
            pools.write(writer)
        except BaseException:
            writer.discard()
            raise
        return writer, rows_in
    finally:
        pools.discard()


def _convert_rows(
    files: list[SourceFile],
    mapping: InputSpec,
    total: int,
    before_row: Callable[[int], None],
    rows_in: _Conversion,
    progress: Progress,
) -> None:
    """Every row of the input, converted; `before_row(position)` is called before each row."""
    columns = needed_columns(mapping)
    started = last_note = time.monotonic()
    row_index = 0
    for file_index, source in enumerate(files):
        for raw in _rows(source, mapping, columns):
            before_row(row_index)
            rows_in.take(file_index, source, raw, row_index)
            row_index += 1
            if time.monotonic() - last_note > 5:
                last_note = time.monotonic()
                progress(f"{row_index:,}/{total:,} rows ({row_index / (last_note - started):,.0f} rows/s)")


def _record_prepare(
    ctx: RunContext,
    entries: list[ManifestEntry],
    identity: dict[str, Any],
    errors: ErrorWriter,
    errors_key: str | None,
    rows_in: _Conversion,
) -> PrepareRecord:
    """The manifest, the chunk list and the prepare record: what the run's later steps read."""
    ctx.store.put(ctx.layout.manifest, write_jsonl(entries))
    ctx.store.put(ctx.layout.metadata, "".join(f"{e.key}\n" for e in entries).encode())
    record = PrepareRecord(
        identity=identity,
        chunks=len(entries),
        rows=sum(e.rows for e in entries),
        errors=errors.count,
        errors_key=errors_key,
        first_errors=errors.first,
        created_at=time.time(),
        models=dict(rows_in.models.most_common()),
        not_utf8_rows=rows_in.not_utf8.rows,
        not_utf8_bytes=rows_in.not_utf8.bytes,
        first_not_utf8=rows_in.not_utf8.first,
    )
    ctx.store.put(ctx.layout.prepare_record, record.to_bytes())
    return record


def _identity(ctx: RunContext, files: list[SourceFile]) -> dict[str, Any]:
    """What a prepare was made from: each file's content (name, size, digest; not its path or
    mtime, so the same data found from elsewhere, or touched, is the same input), the input
    mapping and the chunking."""
    return {
        "sources": [{"uri": f.uri, "name": f.name, "size": f.size, "digest": content_digest(f)} for f in files],
        "input": ctx.spec.input.model_dump(mode="json"),
        "chunking": ctx.spec.chunking.model_dump(mode="json"),
    }


def _already_prepared(ctx: RunContext, done: PrepareRecord, files: list[SourceFile], started: float) -> PrepareReport:
    """The report of a prepare that already happened, if it was of the same input; refused otherwise,
    saying what differs: which file, its size, the first row whose request is not the one prepared."""
    differences = input_differences(done.identity, files)
    if differences:
        where = _first_difference(ctx, files)
        raise InputError(
            f"run {ctx.layout.run!r} was prepared from other inputs:\n  "
            + "\n  ".join(differences + ([f"first differing row: {where}"] if where else [])),
            where=ctx.layout.prepare_record,
            hint="use a new --run name for different data",
        )
    return PrepareReport(ctx.layout.run, done, already_prepared=True, seconds=time.monotonic() - started)


def input_differences(identity: dict[str, Any], files: list[SourceFile]) -> list[str]:
    """How the files now differ from those recorded, file by file (content, not paths)."""
    before = identity.get("sources", [])
    out = []
    if len(before) != len(files):
        out.append(f"{len(before)} file(s) then ({_names(before)}), {len(files)} now ({_names(files)})")
    for then, now in zip(before, files, strict=False):
        name = then.get("name") or str(then.get("uri", "?")).rsplit("/", 1)[-1]
        if then.get("size") != now.size:
            out.append(f"{now.uri}: {now.size:,} bytes, {then.get('size', 0):,} when prepared (as {name})")
        elif "digest" not in then:
            continue  # recorded by an orch that kept no digest: the size is all there is to compare
        elif then["digest"] != content_digest(now):
            out.append(f"{now.uri}: same size ({now.size:,} bytes) as {name} when prepared, different content")
    return out


def _names(files: list[Any]) -> str:
    names = [f.name if isinstance(f, SourceFile) else f.get("name") or f.get("uri", "?") for f in files]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _first_difference(ctx: RunContext, files: list[SourceFile]) -> str | None:
    """The first input row (file:line) whose request is not the one in the prepared chunks."""
    spec, store, layout = ctx.spec, ctx.store, ctx.layout
    if spec.chunking.group_by_prefix or spec.models or spec.sweep.arms:
        return None  # chunks hold rows in prefix (or model) order: the files' differences are all there is to say
    convert = make_converter(spec.input, spec.sampling, spec.model.name, spec.model.runner)
    columns = needed_columns(spec.input)

    def prepared() -> Iterator[bytes]:
        for entry in read_jsonl(ManifestEntry, store.get(layout.manifest).data, layout.manifest):
            with store.open(layout.chunk(entry.chunk)) as f:
                yield from f

    lines = prepared()
    for source in files:
        for raw in _rows(source, spec.input, columns):
            if raw.record is None:
                continue
            try:
                request = convert(raw.record, source.name, raw.number)
            except BadRow:
                continue
            then = next(lines, None)
            if then is None:
                return f"{source.uri}:{raw.number}: a row the prepared run does not have"
            if then != request.line:
                old_id = json.loads(then).get("custom_id")
                return f"{source.uri}:{raw.number} (custom_id {request.custom_id!r}; prepared: {old_id!r})"
    if next(lines, None) is not None:
        return "the prepared run has more rows than the input now"
    return None


def _chunk_boundaries(chunking: ChunkingSpec, total: int) -> list[int]:
    """Row positions where chunks start (and the total last): input positions, so bad rows never shift them."""
    if total == 0:
        return [0]  # no chunk at all
    if chunking.num_chunks is not None:
        count = min(chunking.num_chunks, total)
        return [total * i // count for i in range(count + 1)]
    size = chunking.rows_per_chunk or 1
    return [min(i * size, total) for i in range(-(-total // size) + 1)]


def _rows(source: SourceFile, spec_input: InputSpec, columns: list[str] | None) -> Iterator[RawRow]:
    if (
        source.kind == "parquet"
        and spec_input.format == "chat"
        and spec_input.turns == "first"
        and not spec_input.template
    ):
        return parquet_first_user_turns(source, spec_input.conversation_column, spec_input.id_column)
    return iter_rows(source, columns, spec_input.max_line_bytes)


def _existing_record(ctx: RunContext) -> PrepareRecord | None:
    found = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    return found[0] if found is not None else None


def _describe(identity: dict[str, Any]) -> str:
    uris = [s["uri"] for s in identity.get("sources", [])]
    return ", ".join(uris[:3]) + (f" and {len(uris) - 3} more" if len(uris) > 3 else "")


class _Conversion:
    """Step 2 for one row at a time: a request for its chunk, or a bad row set aside, and the counts."""

    def __init__(
        self,
        ctx: RunContext,
        files: list[SourceFile],
        keep: Callable[[Request, int], None],
        errors: ErrorWriter,
        strict: bool,
    ):
        self.spec_input = ctx.spec.input
        # Several models: a line names its own (body.model) or goes to the first; none is filled in.
        one_model = None if ctx.spec.models else ctx.spec.model.name
        self.convert = make_converter(ctx.spec.input, ctx.spec.sampling, one_model, ctx.spec.model.runner)
        self.router = ModelRouter(model_names(ctx.spec), list(ctx.spec.models)) if ctx.spec.models else None
        self.arms = sweep_arms(ctx.spec)
        self.files = files
        self.keep = keep  # a good request and its input position
        self.errors = errors
        self.seen: dict[str, tuple[int, int]] = {}  # custom_id -> (file, row) where it first appeared
        self.models: collections.Counter[str] = collections.Counter()
        self.not_utf8 = _NotUtf8(strict)

    def take(self, file_index: int, source: SourceFile, raw: RawRow, position: int) -> None:
        problem = self._unreadable(source, raw)
        if self.arms:
            # A sweep: the row once per arm, at its place in the space of position x arm.
            for index, arm in enumerate(self.arms):
                where = position * len(self.arms) + index
                self._take(arm.convert, file_index, source, raw, where, problem, arm)
            return
        self._take(self.convert, file_index, source, raw, position, problem, None)

    def _take(
        self,
        convert: Converter,
        file_index: int,
        source: SourceFile,
        raw: RawRow,
        position: int,
        problem: str | None,
        arm: Arm | None,
    ) -> None:
        request = problem or self._request(convert, file_index, source, raw)
        arm_name = None if arm is None else arm.name
        if isinstance(request, str):
            self.errors.set_aside(source, raw, position, self.spec_input, request, arm=arm_name)
            return
        if request.named_model is not None:
            self.models[request.named_model] += 1
        if arm is not None:
            self.keep(dataclasses.replace(request, pool=arm.pool), position)
            return
        if self.router is None:
            self.keep(request, position)
            return
        pool = self.router.pool_of(request)
        if pool is None:
            self.errors.set_aside(
                source, raw, position, self.spec_input, self.router.not_found(request), code=MODEL_NOT_FOUND
            )
            return
        self.keep(dataclasses.replace(request, pool=pool), position)

    def _unreadable(self, source: SourceFile, raw: RawRow) -> str | None:
        """What makes the row unusable before any conversion, or None."""
        if raw.record is None:
            return raw.problem or "unreadable"
        if raw.replaced and self.not_utf8.add(source, raw) is not None:
            return f"{raw.replaced} byte(s) of the line are not UTF-8"
        return None

    def _request(self, convert: Converter, file_index: int, source: SourceFile, raw: RawRow) -> Request | str:
        """The row's request, or what is wrong with it."""
        try:
            request = convert(raw.record or {}, source.name, raw.number)
        except BadRow as e:
            return str(e)
        first = self.seen.setdefault(request.custom_id, (file_index, raw.number))
        if first != (file_index, raw.number):
            return f"duplicate custom_id {request.custom_id!r} (first at {self.files[first[0]].uri}:{first[1]})"
        return request


class _NotUtf8:
    """Rows with bytes that are not UTF-8: kept (read as U+FFFD) and counted, or bad rows with --strict."""

    SHOWN = 5

    def __init__(self, strict: bool):
        self.strict = strict
        self.rows = self.bytes = 0
        self.first: list[str] = []

    def add(self, source: SourceFile, raw: RawRow) -> str | None:
        """None when the row is kept; with --strict, the reason to set it aside."""
        if self.strict:
            return "not UTF-8"
        self.rows += 1
        self.bytes += raw.replaced
        if len(self.first) < self.SHOWN:
            self.first.append(f"{source.uri}:{raw.number}")
        return None

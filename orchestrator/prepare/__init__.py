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

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.protocol.layout import chunk_id
from orchestrator.core.records import ManifestEntry, PrepareError, PrepareRecord, read_record, write_jsonl
from orchestrator.core.spec import ChunkingSpec, InputSpec
from orchestrator.prepare.formats import BadRow, Request, make_converter, needed_columns
from orchestrator.prepare.sources import (
    RawRow,
    SourceFile,
    count_rows,
    iter_rows,
    parquet_first_user_turns,
    resolve_sources,
)

Progress = Callable[[str], None]
_EXCERPT = 200


@dataclass
class PrepareReport:
    run: str
    chunks: int
    rows: int
    errors: int
    errors_key: str | None
    already_prepared: bool
    seconds: float
    #: The first few bad rows, `file:line: what is wrong` (all of them are in the errors file).
    first_errors: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_s": round(self.rows_per_s, 1)}


def prepare_run(
    ctx: RunContext, sources: list[str], *, strict: bool = False, progress: Progress = lambda _line: None
) -> PrepareReport:
    started = time.monotonic()
    spec, store, layout = ctx.spec, ctx.store, ctx.layout
    files = resolve_sources(sources)
    identity = {
        "sources": [f.describe() for f in files],
        "input": spec.input.model_dump(mode="json"),
        "chunking": spec.chunking.model_dump(mode="json"),
    }
    done = _existing_record(ctx)
    if done is not None:
        return _already_prepared(ctx, done, identity, started)
    if spec.chunking.num_chunks is None and spec.chunking.rows_per_chunk is None:
        raise InputError("say how to chunk the data", hint="--num-chunks N or --rows-per-chunk K")

    total = sum(count_rows(f) for f in files)
    if total == 0:
        raise InputError("the input has no rows", where=", ".join(f.uri for f in files))
    boundaries = _chunk_boundaries(spec.chunking, total)
    chunks_total = len(boundaries) - 1
    progress(f"{total:,} rows in {len(files)} file(s) -> {chunks_total} chunks")

    convert = make_converter(spec.input, spec.sampling, spec.model.name)
    columns = needed_columns(spec.input)
    writer = _ChunkWriter(ctx, chunks_total)
    errors = _ErrorWriter(strict)
    seen: dict[str, tuple[int, int]] = {}  # custom_id -> (file, row) where it first appeared
    row_index = 0
    last_note = time.monotonic()
    try:
        for file_index, source in enumerate(files):
            for raw in _rows(source, spec.input, columns):
                # Chunk boundaries are positions in the input, so bad rows never shift them.
                while row_index >= boundaries[writer.index + 1]:
                    writer.next_chunk()
                row_index += 1
                if raw.record is None:
                    errors.add(source, raw.number, raw.problem or "unreadable", raw.raw)
                    continue
                try:
                    request = convert(raw.record, source.name, raw.number)
                except BadRow as e:
                    errors.add(source, raw.number, str(e), raw.raw or _excerpt(raw.record))
                    continue
                first = seen.setdefault(request.custom_id, (file_index, raw.number))
                if first != (file_index, raw.number):
                    errors.add(
                        source,
                        raw.number,
                        f"duplicate custom_id {request.custom_id!r} (first at {files[first[0]].uri}:{first[1]})",
                        raw.raw or _excerpt(raw.record),
                    )
                    continue
                writer.add(request)
                if time.monotonic() - last_note > 5:
                    last_note = time.monotonic()
                    progress(f"{row_index:,}/{total:,} rows ({row_index / (last_note - started):,.0f} rows/s)")
        while writer.index < chunks_total - 1:
            writer.next_chunk()
        entries = writer.close()
        errors_key = errors.upload(ctx)
    finally:
        writer.discard()
        errors.discard()

    store.put(layout.manifest, write_jsonl(entries))
    store.put(layout.metadata, "".join(f"{e.key}\n" for e in entries).encode())
    rows = sum(e.rows for e in entries)
    record = PrepareRecord(
        identity=identity,
        chunks=len(entries),
        rows=rows,
        errors=errors.count,
        errors_key=errors_key,
        first_errors=errors.first,
        created_at=time.time(),
    )
    store.put(layout.prepare_record, record.to_bytes())
    return PrepareReport(
        layout.run, len(entries), rows, errors.count, errors_key, False, time.monotonic() - started, errors.first
    )


def _already_prepared(ctx: RunContext, done: PrepareRecord, identity: dict[str, Any], started: float) -> PrepareReport:
    """The report of a prepare that already happened, if it was of the same input; refused otherwise."""
    if done.identity != identity:
        raise InputError(
            f"run {ctx.layout.run!r} was prepared from other inputs ({_describe(done.identity)})",
            where=ctx.layout.prepare_record,
            hint="use a new --run name for different data",
        )
    return PrepareReport(
        ctx.layout.run,
        done.chunks,
        done.rows,
        done.errors,
        done.errors_key,
        True,
        time.monotonic() - started,
        done.first_errors,
    )


def _chunk_boundaries(chunking: ChunkingSpec, total: int) -> list[int]:
    """Row positions where chunks start (and the total last): input positions, so bad rows never shift them."""
    if chunking.num_chunks is not None:
        count = min(chunking.num_chunks, total)
        return [total * i // count for i in range(count + 1)]
    size = chunking.rows_per_chunk or 1
    return [min(i * size, total) for i in range(-(-total // size) + 1)]


def _rows(source: SourceFile, spec_input: InputSpec, columns: list[str] | None) -> Iterator[RawRow]:
    if source.kind == "parquet" and spec_input.format == "chat" and spec_input.turns == "first":
        return parquet_first_user_turns(source, spec_input.conversation_column, spec_input.id_column)
    return iter_rows(source, columns)


def _existing_record(ctx: RunContext) -> PrepareRecord | None:
    found = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    return found[0] if found is not None else None


def _describe(identity: dict[str, Any]) -> str:
    uris = [s["uri"] for s in identity.get("sources", [])]
    return ", ".join(uris[:3]) + (f" and {len(uris) - 3} more" if len(uris) > 3 else "")


def _excerpt(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)[:_EXCERPT]


class _ChunkWriter:
    """Fills one local temp file per chunk and uploads it when the chunk is complete."""

    def __init__(self, ctx: RunContext, total: int):
        self.ctx = ctx
        self.total = total
        self.dir = tempfile.mkdtemp(prefix="orch-prepare-")
        self.entries: list[ManifestEntry] = []
        self.index = 0
        self._open()

    def _open(self) -> None:
        self.chunk = chunk_id(self.index, self.total)
        self.path = os.path.join(self.dir, f"{self.chunk}.jsonl")
        self.file = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 - spans add() calls; closed by _seal/discard
        self.rows = self.bytes = self.prompt_tokens = self.output_tokens = 0

    def add(self, request: Request) -> None:
        self.file.write(request.line)
        self.rows += 1
        self.bytes += len(request.line)
        self.prompt_tokens += request.est_prompt_tokens
        self.output_tokens += request.max_output_tokens

    def _seal(self) -> None:
        self.file.close()
        layout = self.ctx.layout
        self.ctx.store.put_file(layout.chunk(self.chunk), self.path)
        os.unlink(self.path)
        self.entries.append(
            ManifestEntry(
                chunk=self.chunk,
                key=layout.chunk_path(self.chunk),
                rows=self.rows,
                bytes=self.bytes,
                est_prompt_tokens=self.prompt_tokens,
                max_output_tokens=self.output_tokens,
            )
        )

    def next_chunk(self) -> None:
        self._seal()
        self.index += 1
        self._open()

    def close(self) -> list[ManifestEntry]:
        self._seal()
        # A chunk whose every row was bad has nothing to run.
        return [e for e in self.entries if e.rows > 0]

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


class _ErrorWriter:
    """Bad rows, each with its file and line, kept in the run's errors file; --strict stops at the first."""

    #: How many bad rows the report shows on the console.
    SHOWN = 5

    def __init__(self, strict: bool):
        self.strict = strict
        self.count = 0
        self.first: list[str] = []
        fd, self.path = tempfile.mkstemp(prefix="orch-prepare-errors-", suffix=".jsonl")
        self.file = os.fdopen(fd, "w")

    def add(self, source: SourceFile, number: int, problem: str, raw: str) -> None:
        if self.strict:
            raise InputError(
                problem, where=f"{source.uri}:{number}", hint="fix the row, or drop --strict to set bad rows aside"
            )
        self.count += 1
        if len(self.first) < self.SHOWN:
            self.first.append(f"{source.uri}:{number}: {problem}")
        at = {"row": number} if source.kind == "parquet" else {"line": number}
        record = PrepareError(source=source.uri, error=problem, excerpt=raw[:_EXCERPT], **at)
        self.file.write(record.model_dump_json(exclude_none=True) + "\n")

    def upload(self, ctx: RunContext) -> str | None:
        self.file.close()
        key = ctx.layout.prepare_errors
        if self.count:
            ctx.store.put_file(key, self.path)
            return key
        ctx.store.delete(key)
        return None

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

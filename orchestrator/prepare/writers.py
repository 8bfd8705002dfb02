"""Where prepare's rows go: good requests into chunk files (uploaded as each closes, with their
manifest entries), bad rows into the run's errors file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.layout import chunk_id
from orchestrator.core.records import ManifestEntry, PrepareError, write_jsonl
from orchestrator.core.spec import InputSpec
from orchestrator.prepare.formats import Request, fallback_custom_id
from orchestrator.prepare.grouping import PrefixStats, Row
from orchestrator.prepare.source_file import SourceFile
from orchestrator.prepare.sources import RawRow

#: How much of a bad row its error record and the report quote.
EXCERPT = 200


def excerpt(record: dict[str, Any], limit: int | None = EXCERPT) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)[:limit]


class ChunkWriter:
    """Fills one local temp file per chunk and uploads them once the input is read (grouped: as each closes).

    Ungrouped, chunk boundaries are input positions (bad rows never shift them); grouped by prefix,
    or with rows answered from earlier runs (`positioned`), they are counts of the rows written, and
    each chunk also gets its rows' input positions."""

    def __init__(
        self,
        ctx: RunContext,
        boundaries: list[int],
        *,
        grouped: bool = False,
        positioned: bool = False,
        by_prefix: bool = True,
    ):
        self.ctx = ctx
        self.total = len(boundaries) - 1
        self.boundaries = boundaries
        self.grouped = grouped
        self.positioned = grouped or positioned
        #: Sorted by model alone (a run of several models, ungrouped): positions, but no prefix groups.
        self.by_prefix = by_prefix
        self.written = 0
        self.model: str | None = None
        self.dir = tempfile.mkdtemp(prefix="orch-prepare-")
        self.entries: list[ManifestEntry] = []
        # Ungrouped, chunks are written while the input is read and checked: each is uploaded only
        # once every row passed prepare's request check (close), so a refused input writes none.
        # Grouped, the writer starts after the whole input was read: each is uploaded as it closes.
        self.sealed: list[tuple[str, str]] = []
        self.index = 0
        self._open()

    def _open(self) -> None:
        self.chunk = chunk_id(self.index, self.total)
        self.path = os.path.join(self.dir, f"{self.chunk}.jsonl")
        self.file = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 - spans add() calls; closed by _seal/discard
        self.rows = self.bytes = self.prompt_tokens = self.output_tokens = 0
        self.prefixes = PrefixStats()

    def add(self, request: Request, _position: int = 0) -> None:
        self._write(request.line, request.est_prompt_tokens, request.max_output_tokens)

    def add_positioned(self, request: Request, position: int) -> None:
        """Reusing: the rows to run, `boundaries` rows to a chunk, each with its input position."""
        if self.index < self.total - 1 and self.written >= self.boundaries[self.index + 1]:
            self.next_chunk()
        self._write(request.line, request.est_prompt_tokens, request.max_output_tokens)
        self.prefixes.positions.append(position)

    def _write(self, line: bytes, prompt_tokens: int, output_tokens: int) -> None:
        self.file.write(line)
        self.written += 1
        self.rows += 1
        self.bytes += len(line)
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens

    def advance_to(self, position: int) -> None:
        """Ungrouped: close the chunks that end before this input position."""
        while self.index < self.total - 1 and position >= self.boundaries[self.index + 1]:
            self.next_chunk()

    def write_sorted(self, rows: Iterator[Row], model: str | None = None) -> None:
        """Grouped: the rows in prefix order, `boundaries` rows to a chunk (counted over every
        call: a run of several models writes each model's rows in turn, `model` naming them)."""
        for head, position, line, prompt_tokens, output_tokens in rows:
            if self.index < self.total - 1 and self.written >= self.boundaries[self.index + 1]:
                self.next_chunk()
            self.model = model
            self._write(line, prompt_tokens, output_tokens)
            self.prefixes.add(head, position)

    def _seal(self) -> None:
        self.file.close()
        if self.rows == 0:  # every row of it was bad: nothing to run, nothing to upload
            os.unlink(self.path)
            return
        layout = self.ctx.layout
        if self.grouped:
            self._upload(layout.chunk(self.chunk), self.path)
        else:
            self.sealed.append((layout.chunk(self.chunk), self.path))
        grouped: dict[str, Any] = {}
        stats = self.prefixes
        if self.positioned:
            positions = stats.positions_file()
            self.ctx.store.put(layout.chunk_positions(self.chunk), positions)
            grouped["positions"] = layout.chunk_positions(self.chunk).removeprefix(layout.root)
            grouped["positions_sha256"] = hashlib.sha256(positions).hexdigest()
        if self.grouped and self.by_prefix:
            grouped.update(
                prefix_groups=stats.groups, est_shared_tokens=stats.shared_tokens, edge_prefixes=stats.edge_prefixes()
            )
        self.entries.append(
            ManifestEntry(
                chunk=self.chunk,
                key=layout.chunk_path(self.chunk),
                rows=self.rows,
                bytes=self.bytes,
                est_prompt_tokens=self.prompt_tokens,
                max_output_tokens=self.output_tokens,
                first=None if self.positioned else self.boundaries[self.index],
                model=self.model or None,  # "": a sweep over one model's prompts
                **grouped,
            )
        )

    def next_chunk(self) -> None:
        self._seal()
        self.index += 1
        self._open()

    def close(self) -> list[ManifestEntry]:
        """The last chunk sealed, every chunk uploaded, and their manifest entries."""
        self._seal()
        for key, path in self.sealed:
            self._upload(key, path)
        self.sealed.clear()
        return self.entries

    def _upload(self, key: str, path: str) -> None:
        self.ctx.store.put_file(key, path)
        os.unlink(path)

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def write_manifest(ctx: RunContext, entries: list[ManifestEntry]) -> None:
    """The run's chunk list as later steps read it: manifest.jsonl, and metadata.txt (a chunk's key a
    line, the SkyPilot example's shape). Written after every chunk it names."""
    ctx.store.put(ctx.layout.metadata, "".join(f"{e.key}\n" for e in entries).encode())
    ctx.store.put(ctx.layout.manifest, write_jsonl(entries))


class ErrorWriter:
    """Bad rows, each with its file and line, kept in the run's errors file; --strict stops at the first."""

    #: How many bad rows the report shows on the console.
    SHOWN = 5

    def __init__(self, strict: bool, *, several_files: bool = False):
        self.strict = strict
        self.several_files = several_files
        self.count = 0
        self.first: list[str] = []
        fd, self.path = tempfile.mkstemp(prefix="orch-prepare-errors-", suffix=".jsonl")
        self.file = os.fdopen(fd, "w")

    def set_aside(
        self,
        source: SourceFile,
        raw: RawRow,
        position: int,
        spec_input: InputSpec,
        problem: str,
        code: str | None = None,
        arm: str | None = None,
    ) -> None:
        """A bad row, with why (and the error line's code, when not invalid_request); in a sweep
        once per arm, its custom_id with the arm after it."""
        text = raw.raw or excerpt(raw.record or {}, limit=None)
        custom_id = fallback_custom_id(raw.record, spec_input, source.name, raw.number) or self.stand_in(
            source, raw.number
        )
        if arm is not None:
            custom_id = f"{custom_id}#{arm}"
        self.add(source, raw.number, problem, text, position, custom_id, raw.too_long, code)

    def stand_in(self, source: SourceFile, number: int) -> str:
        """The custom_id of a row that has none (not JSON, no custom_id, no id value), as OpenAI batch
        consumers expect a string: `line-<n>` (`row-<n>` in Parquet), after `<file>:` when the input
        has several files, so that it names one row."""
        stand_in = f"{'line' if source.kind.startswith('jsonl') else 'row'}-{number}"
        return f"{source.name}:{stand_in}" if self.several_files else stand_in

    def add(
        self,
        source: SourceFile,
        number: int,
        problem: str,
        raw: str,
        position: int,
        custom_id: str | None,
        too_long: int | None = None,
        code: str | None = None,
    ) -> None:
        if self.strict:
            raise InputError(
                problem, where=f"{source.uri}:{number}", hint="fix the row, or drop --strict to set bad rows aside"
            )
        self.count += 1
        if len(self.first) < self.SHOWN:
            self.first.append(f"{source.uri}:{number}: {problem}")
        at = {"line": number} if source.kind.startswith("jsonl") else {"row": number}
        record = PrepareError(
            source=source.uri,
            error=problem,
            excerpt=raw[:EXCERPT],
            position=position,
            custom_id=custom_id,
            text=None if too_long is not None else raw,  # only its start was read
            line_bytes=too_long,
            code=code,
            **at,
        )
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

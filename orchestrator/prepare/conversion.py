"""Prepare's step 2, a row at a time: each input row read as its format says and turned into a
request (for its model's pool, or once per sweep arm), checked as the workers would check it, or
set aside as a bad row with its file and line. A custom_id seen on an earlier row stops prepare
once every row is read, each repeat listed with both places (RepeatedIds): collect answers an id
once, and two rows with one id would give two lines for it."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Container, Iterator
from typing import Protocol

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.spec import InputSpec
from orchestrator.prepare.check import RequestCheck
from orchestrator.prepare.formats import BadRow, Converter, Request, make_converter, needed_columns
from orchestrator.prepare.pools import MODEL_NOT_FOUND, model_router
from orchestrator.prepare.source_file import COLUMNAR_KINDS, SourceFile
from orchestrator.prepare.sources import RawRow, iter_rows, parquet_first_user_turns
from orchestrator.prepare.sweep import Arm, sweep_arms
from orchestrator.prepare.writers import ErrorWriter


class RowStream(Protocol):
    """What conversion feeds: the first stage of a chain (prepare/stages.py)."""

    def add(self, request: Request, position: int) -> None:
        """A converted request at its input position."""

    def before_row(self, position: int) -> None:
        """Called before each input row is converted (streamed chunks close at input positions)."""


Progress = Callable[[str], None]


def convert_into(
    ctx: RunContext,
    files: list[SourceFile],
    total: int,
    into: RowStream,
    errors: ErrorWriter,
    strict: bool,
    progress: Progress,
    *,
    requests: RequestCheck | None = None,
    first_position: int = 0,
    only: Container[int] | None = None,
) -> Conversion:
    """Every row of `files` converted (and checked, with `requests`) into the chain `into`, input
    positions counted from `first_position` (a grown table's appended rows come after its older
    ones); with `only`, just the rows at those input positions, numbered again from 0 (a pilot's
    sample is its run's whole input). Returns the conversion, with its counts."""
    conversion = Conversion(ctx, files, into, errors, strict, requests)
    conversion.run(total, progress, first_position, only)
    return conversion


def input_rows(source: SourceFile, spec_input: InputSpec, columns: list[str] | None) -> Iterator[RawRow]:
    if (
        source.kind in COLUMNAR_KINDS
        and spec_input.format == "chat"
        and spec_input.turns == "first"
        and not spec_input.template
    ):
        return parquet_first_user_turns(source, spec_input.conversation_column, spec_input.id_column)
    return iter_rows(source, columns, spec_input.max_line_bytes)


class Conversion:
    """Step 2 for one row at a time: a request for its chunk, or a bad row set aside, and the counts."""

    def __init__(
        self,
        ctx: RunContext,
        files: list[SourceFile],
        into: RowStream,
        errors: ErrorWriter,
        strict: bool,
        requests: RequestCheck | None = None,
    ):
        self.spec_input = ctx.spec.input
        self.requests = requests  # the request check, when prepare checks
        # Several models: a line names its own (body.model) or goes to the first; none is filled in.
        one_model = None if ctx.spec.models else ctx.spec.model.name
        self.convert = make_converter(ctx.spec.input, ctx.spec.sampling, one_model, ctx.spec.model.runner)
        self.router = model_router(ctx.spec)
        self.arms = sweep_arms(ctx.spec)
        self.files = files
        self.into = into  # the first stage: a good request and its input position
        self.keep = into.add
        self.errors = errors
        self.seen: dict[str, tuple[int, int]] = {}  # custom_id -> (file, row) where it first appeared
        self.repeated = RepeatedIds()
        self.models: collections.Counter[str] = collections.Counter()
        self.not_utf8 = NotUtf8(strict)
        self.current: tuple[SourceFile, RawRow] | None = None

    def run(self, total: int, progress: Progress, first_position: int = 0, only: Container[int] | None = None) -> None:
        """Every row of the files (those at the positions `only` names), converted in order: the one
        loop prepare turns rows into requests in."""
        columns = needed_columns(self.spec_input)
        started = last_note = time.monotonic()
        row_index = taken = 0
        for file_index, source in enumerate(self.files):
            for raw in input_rows(source, self.spec_input, columns):
                row_index += 1
                if only is not None and row_index - 1 not in only:
                    continue
                position = first_position + taken
                taken += 1
                self.into.before_row(position)
                self.take(file_index, source, raw, position)
                if time.monotonic() - last_note > 5:
                    last_note = time.monotonic()
                    progress(f"{row_index:,}/{total:,} rows ({row_index / (last_note - started):,.0f} rows/s)")
        self.repeated.stop_if_any()

    def where(self) -> str:
        """The input row being converted, as `file:line` (`file:row` in Parquet)."""
        return f"{self.current[0].uri}:{self.current[1].number}" if self.current else "?"

    def take(self, file_index: int, source: SourceFile, raw: RawRow, position: int) -> None:
        self.current = (source, raw)
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
        if request is None:  # a repeated custom_id: noted, and prepare stops once every row is read
            return
        arm_name = None if arm is None else arm.name
        if isinstance(request, str):
            self.errors.set_aside(source, raw, position, self.spec_input, request, arm=arm_name)
            return
        if request.named_model is not None:
            self.models[request.named_model] += 1
        if self.requests is not None:
            self.requests.add(request, source.uri, raw.number)
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

    def _request(self, convert: Converter, file_index: int, source: SourceFile, raw: RawRow) -> Request | str | None:
        """The row's request, what is wrong with it, or None for a custom_id an earlier row has (noted)."""
        try:
            request = convert(raw.record or {}, source.name, raw.number)
        except BadRow as e:
            return str(e)
        first = self.seen.setdefault(request.custom_id, (file_index, raw.number))
        if first != (file_index, raw.number):
            self.repeated.add(request.custom_id, f"{self.files[first[0]].uri}:{first[1]}", f"{source.uri}:{raw.number}")
            return None
        return request


class RepeatedIds:
    """custom_ids found on a second row: how many, and the first few with both places."""

    SHOWN = 5

    def __init__(self) -> None:
        self.count = 0
        self.first: list[str] = []

    def add(self, custom_id: str, first: str, again: str) -> None:
        self.count += 1
        if len(self.first) < self.SHOWN:
            self.first.append(f"{custom_id!r}: {first} and {again}")

    def stop_if_any(self) -> None:
        if not self.count:
            return
        more = f"\n  ... and {self.count - len(self.first):,} more" if self.count > len(self.first) else ""
        raise InputError(
            f"{self.count:,} row(s) repeat a custom_id of an earlier row (collect answers each id once):\n  "
            + "\n  ".join(self.first)
            + more,
            hint="give each row its own custom_id: --id-column naming a column of unique values, or no "
            "--id-column (each row's id is then its file:line); nothing was written",
        )


class NotUtf8:
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

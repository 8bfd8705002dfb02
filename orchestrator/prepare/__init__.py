"""`orch prepare`: stream a dataset into chunks of canonical requests, a manifest and metadata.txt.

1. Resolve the sources and count their rows (Parquet metadata; one pass over JSONL lines).
2. Stream rows through the format's converter; good requests fill chunk files (local temp files),
   bad rows go to the errors file (or stop everything with --strict). Each request is checked as
   the workers will check it (prepare/check.py): a request they would refuse stops prepare with
   every such problem listed, before any chunk is uploaded. `--check` does this step alone.
3. Write the errors file, manifest.jsonl, metadata.txt, and last the prepare record. A run with a
   prepare record is prepared: running the same command again changes nothing, and a different
   input on the same run is refused. A prepare that died before its record is simply redone: the
   same input gives byte-identical chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.records import ManifestEntry, PrepareRecord, read_jsonl, read_record, write_jsonl
from orchestrator.core.spec import DEFAULT_ROWS_PER_CHUNK, ChunkingSpec, RunSpec
from orchestrator.prepare.answer_keys import AnswerKeys, PoolKeys
from orchestrator.prepare.check import RequestCheck
from orchestrator.prepare.conversion import Conversion, convert_rows, input_rows
from orchestrator.prepare.formats import BadRow, Request, make_converter, needed_columns
from orchestrator.prepare.grouping import PrefixSorter
from orchestrator.prepare.grown import Grown, grown_table, old_rows_keyed
from orchestrator.prepare.identity import input_differences, input_identity
from orchestrator.prepare.pools import PoolSorters
from orchestrator.prepare.reuse import KeyCollector, ReusePlan, plan_reuse
from orchestrator.prepare.source_file import SourceFile
from orchestrator.prepare.sources import count_rows, resolve_sources
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


@dataclass
class CheckReport:
    """What `orch prepare --check` found, writing nothing: the request check, and the rows prepare would set aside."""

    run: str | None
    rows: int
    requests: RequestCheck
    set_aside: int
    first_set_aside: list[str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "rows": self.rows,
            "requests": self.requests.to_dict(),
            "set_aside": self.set_aside,
            "first_set_aside": self.first_set_aside,
            "seconds": round(self.seconds, 3),
        }


def check_run(ctx: RunContext, sources: list[str], *, progress: Progress = lambda _line: None) -> CheckReport:
    """Step 2 without its writing: every row converted and its request checked as the workers would;
    nothing is written to the store (the bad rows' temporary file is discarded)."""
    started = time.monotonic()
    files = resolve_sources(sources)
    total = sum(count_rows(f, ctx.spec.input.max_line_bytes) for f in files)
    errors = ErrorWriter(strict=False, several_files=len(files) > 1)
    requests = RequestCheck(ctx.spec)
    try:
        rows_in = Conversion(ctx, files, lambda _request, _position: None, errors, False, requests)
        convert_rows(files, ctx.spec.input, total, lambda _row: None, rows_in, progress)
    finally:
        errors.discard()
    run = ctx.spec.run
    return CheckReport(run, total, requests, errors.count, errors.first, time.monotonic() - started)


def prepare_run(
    ctx: RunContext,
    sources: list[str],
    *,
    strict: bool = False,
    check: bool = True,
    progress: Progress = lambda _line: None,
) -> PrepareReport:
    """Steps 1-3; with `check` (the default) every request is checked as the workers would, and an
    input with requests they would refuse stops prepare before any chunk is written (RequestsRefused)."""
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
    _refuse_reuse_in_a_cascade(spec)
    errors = ErrorWriter(strict, several_files=len(files) > 1)
    pooled = bool(spec.models or spec.sweep.arms)
    keys = PoolKeys(spec) if pooled else AnswerKeys(spec)
    sorter = PrefixSorter(spec.chunking.prefix_chars) if spec.chunking.group_by_prefix and not pooled else None
    writer: ChunkWriter | None = None
    requests = RequestCheck(spec) if check else None
    reuse: ReusePlan | None = None
    try:  # every temporary file of the steps goes in the end, a refused reuse included
        reuse = _plan_reuse(ctx, files, total, keys, strict, progress, requests) if spec.reuse.runs else None
        if pooled:
            # Reusing, the first pass (_plan_reuse) checked the requests already.
            checked = requests if reuse is None else None
            writer, rows_in = _pooled_chunks(ctx, files, total, errors, strict, progress, checked, reuse)
        elif reuse is not None:
            writer, rows_in = _write_reusing(ctx, files, total, errors, strict, progress, reuse, sorter)
        elif sorter is None:
            writer = ChunkWriter(ctx, _chunk_boundaries(spec.chunking, total))
            progress(f"{total:,} rows in {len(files)} file(s) -> {writer.total} chunks")
            rows_in = Conversion(ctx, files, writer.add, errors, strict, requests)
            convert_rows(files, spec.input, total, writer.advance_to, rows_in, progress)
            writer.advance_to(total)
            _stop_if_refused(requests)
        else:
            progress(f"{total:,} rows in {len(files)} file(s), grouped by prompt prefix")
            rows_in = Conversion(ctx, files, sorter.add, errors, strict, requests)
            convert_rows(files, spec.input, total, lambda _row: None, rows_in, progress)
            _stop_if_refused(requests)
            writer = ChunkWriter(ctx, _chunk_boundaries(spec.chunking, max(sorter.count, 1)), grouped=True)
            writer.write_sorted(sorter.sorted_rows())
        entries = writer.close()
        _check_some_rows(entries, total, errors, reuse.count if reuse else 0)
        identity = input_identity(ctx.spec, files)
        # Recorded only now: a prepare that failed leaves the run's spec free to be corrected.
        ctx.freeze()
        errors_key = errors.upload(ctx)
        if reuse is not None:
            reuse.upload(ctx)
    finally:
        if reuse is not None:
            reuse.discard()
        if writer is not None:
            writer.discard()
        if sorter is not None:
            sorter.discard()
        errors.discard()
    reused: dict[str, Any] = {"reused": reuse.count if reuse else 0}
    if isinstance(keys, PoolKeys):
        reused["key_digests"] = keys.digests
        reused["key_adapters"] = keys.adapters
    else:
        reused["key_digest"] = keys.digest.hex() if keys.usable else None
        reused["key_adapters"] = {"": keys.adapter_names} if keys.adapter_names else {}
    record = _record_prepare(ctx, entries, identity, errors, errors_key, rows_in, reused)
    return PrepareReport(layout.run, record, already_prepared=False, seconds=time.monotonic() - started)


def _stop_if_refused(requests: RequestCheck | None) -> None:
    if requests is not None and not requests.ok:
        raise requests.error()


def _check_some_rows(entries: list[ManifestEntry], total: int, errors: ErrorWriter, reused: int) -> None:
    """An input with rows of which none became a request (nor was reused) is refused, saying why."""
    if entries or total == 0 or reused:
        return
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


def _plan_reuse(
    ctx: RunContext,
    files: list[SourceFile],
    total: int,
    keys: AnswerKeys | PoolKeys,
    strict: bool,
    progress: Progress,
    requests: RequestCheck | None,
) -> ReusePlan:
    """reuse.py steps 1-2: every good row's key, looked up in the runs `reuse.from` names. This
    first pass also checks the requests (`requests`), so a refused one stops before any lookup.
    A sweep keys a request per row and arm, at its place in the space of position x arm."""
    arms = len(ctx.spec.sweep.arms)
    slots = total * max(arms, 1)
    # Only a one-model run's chunks hold its input rows in order: a grown table is read whole otherwise.
    grown = _grown(ctx, files, keys, progress) if isinstance(keys, AnswerKeys) else None
    collected = KeyCollector(keys, slots)
    errors = ErrorWriter(strict, several_files=len(files) > 1)  # the second pass reports bad rows
    try:
        if grown is None:
            rows_in = Conversion(ctx, files, collected.add, errors, strict, requests)
            convert_rows(files, ctx.spec.input, total, lambda _row: None, rows_in, progress)
        else:
            # Only the appended rows are read and keyed; the older ones come keyed from the run that read them.
            collected.add_records(old_rows_keyed(ctx, grown))
            appended = [replace(files[0], since=grown.since)]
            rows_in = Conversion(ctx, appended, lambda r, p: collected.add(r, p + grown.rows), errors, strict, requests)
            convert_rows(appended, ctx.spec.input, total - grown.rows, lambda _row: None, rows_in, progress)
            progress(f"keyed {total - grown.rows:,} appended rows; {grown.rows:,} older rows keyed by {grown.run}")
        _stop_if_refused(requests)
        plan = plan_reuse(ctx, collected, slots)
    finally:
        errors.discard()
        collected.discard()
    of = f"{slots:,} requests ({total:,} rows x {arms} arms)" if arms else f"{total:,} rows"
    progress(
        f"{plan.count:,} of {of} answered by {', '.join(ctx.spec.reuse.runs)}"
        + (f" ({plan.sampled_skipped:,} that sample run again: reuse.sampled)" if plan.sampled_skipped else "")
    )
    return plan


def _grown(ctx: RunContext, files: list[SourceFile], keys: AnswerKeys, progress: Progress) -> Grown | None:
    """The earlier run a grown Iceberg/Delta table can be read incrementally against (grown.py), or None."""
    grown, said = grown_table(ctx, files, keys.digest.hex() if keys.usable else None)
    if said:
        progress(said)
    if grown is not None and keys.samples_by_default and not ctx.spec.reuse.sampled:
        # Whether an older row samples is known only from the row: read and key them all.
        progress("the rows sample (temperature > 0, no seed): the whole table is read and keyed again")
        return None
    return grown


def _write_reusing(
    ctx: RunContext,
    files: list[SourceFile],
    total: int,
    errors: ErrorWriter,
    strict: bool,
    progress: Progress,
    reuse: ReusePlan,
    sorter: PrefixSorter | None,
) -> tuple[ChunkWriter, Conversion]:
    """reuse.py step 3: the rows not reused into chunks (sorted by prefix first when grouping)."""
    spec = ctx.spec
    progress(f"{reuse.good - reuse.count:,} rows to run")
    if sorter is None:
        # Chunks are cut from the rows left to run (step 1 counted the good rows).
        boundaries = _chunk_boundaries(spec.chunking, max(reuse.good - reuse.count, 1))
        writer = ChunkWriter(ctx, boundaries, positioned=True)
        add: Callable[[Request, int], None] = writer.add_positioned
    else:
        add = sorter.add

    def keep(request: Request, position: int) -> None:
        if not reuse.take(request, position):
            add(request, position)

    rows_in = Conversion(ctx, files, keep, errors, strict)
    convert_rows(files, spec.input, total, lambda _row: None, rows_in, progress)
    if sorter is None:
        return writer, rows_in
    writer = ChunkWriter(ctx, _chunk_boundaries(spec.chunking, max(sorter.count, 1)), grouped=True)
    writer.write_sorted(sorter.sorted_rows())
    return writer, rows_in


def _refuse_reuse_in_a_cascade(spec: RunSpec) -> None:
    """A reused first-stage answer is in no chunk: the later stages would never see it to escalate it."""
    if spec.sweep.cascade and spec.reuse.runs:
        raise InputError(
            "reuse.from (--reuse-from) with a cascade (sweep.cascade) is not supported",
            hint="run the cascade without --reuse-from",
        )


def _pooled_chunks(
    ctx: RunContext,
    files: list[SourceFile],
    total: int,
    errors: ErrorWriter,
    strict: bool,
    progress: Progress,
    requests: RequestCheck | None,
    reuse: ReusePlan | None = None,
) -> tuple[ChunkWriter, Conversion]:
    """Several models, or a sweep: rows held per model, then chunks cut per model (prepare/pools.py);
    with `reuse`, only the requests (row x model or arm) no earlier run answered."""
    spec = ctx.spec
    pools = PoolSorters(list(spec.models) or [""], spec.chunking)
    try:
        arms = f" x {len(spec.sweep.arms)} arms" if spec.sweep.arms else ""
        progress(f"{total:,} rows{arms} in {len(files)} file(s), for {len(pools.order)} model(s)")
        keep = pools.add
        if reuse is not None:
            progress(f"{reuse.good - reuse.count:,} requests to run")

            def keep(request: Request, position: int) -> None:
                if not reuse.take(request, position):
                    pools.add(request, position)

        rows_in = Conversion(ctx, files, keep, errors, strict, requests)
        convert_rows(files, spec.input, total, lambda _row: None, rows_in, progress)
        _stop_if_refused(requests)
        writer = ChunkWriter(ctx, pools.boundaries(), grouped=True, by_prefix=spec.chunking.group_by_prefix)
        try:
            pools.write(writer)
        except BaseException:
            writer.discard()
            raise
        return writer, rows_in
    finally:
        pools.discard()


def _record_prepare(
    ctx: RunContext,
    entries: list[ManifestEntry],
    identity: dict[str, Any],
    errors: ErrorWriter,
    errors_key: str | None,
    rows_in: Conversion,
    reused: dict[str, Any],
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
        **reused,
    )
    ctx.store.put(ctx.layout.prepare_record, record.to_bytes())
    return record


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
        for raw in input_rows(source, spec.input, columns):
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


def _existing_record(ctx: RunContext) -> PrepareRecord | None:
    found = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    return found[0] if found is not None else None

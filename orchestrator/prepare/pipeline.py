"""`orch prepare`: stream a dataset into chunks of canonical requests, a manifest and metadata.txt.

1. Resolve the sources and count their rows (Parquet metadata; one pass over JSONL lines).
2. With `--reuse-from`, a first pass keys every row and looks the keys up in the named runs'
   answer indexes (reuse.py): the plan of which rows are answered already.
3. Stream rows through conversion (conversion.py: convert, check as the workers would, route to a
   model pool) into the chain of stages the spec composes (stages.compose: reuse filter, order,
   chunks); bad rows go to the errors file (or stop everything with --strict). A request the
   workers would refuse stops prepare with every such problem listed, before any chunk is
   uploaded. `--check` runs this step alone, keeping nothing.
4. Write the errors file, manifest.jsonl, metadata.txt, and last the prepare record. A run with a
   prepare record is prepared: running the same command again changes nothing, and a different
   input on the same run is refused. A prepare that died before its record is simply redone: the
   same input gives byte-identical chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.records import ManifestEntry, PrepareRecord, read_jsonl, read_record
from orchestrator.core.spec import DEFAULT_ROWS_PER_CHUNK, RunSpec
from orchestrator.prepare.answers.answer_keys import AnswerKeys, PoolKeys
from orchestrator.prepare.answers.reuse import KeyCollector, ReusePlan, plan_reuse
from orchestrator.prepare.check import RequestCheck
from orchestrator.prepare.conversion import Conversion, convert_into
from orchestrator.prepare.grown import Grown, grown_table, old_rows_keyed
from orchestrator.prepare.identity import input_differences, input_identity
from orchestrator.prepare.sampling import RowStrata
from orchestrator.prepare.source_file import SourceFile
from orchestrator.prepare.sources import count_rows, resolve_sources
from orchestrator.prepare.stages import Chunker, NoChunks, PreparedLines, compose
from orchestrator.prepare.writers import ErrorWriter, write_manifest

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
    """What `orch prepare --check` found, writing nothing: the request check, the rows prepare would set
    aside, and with `--reuse-from` how many requests earlier runs answered and how many are left to pay for."""

    run: str | None
    rows: int
    requests: RequestCheck
    set_aside: int
    first_set_aside: list[str]
    seconds: float
    reused: int | None = None
    to_run: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "rows": self.rows,
            "requests": self.requests.to_dict(),
            "set_aside": self.set_aside,
            "first_set_aside": self.first_set_aside,
            "reused": self.reused,
            "to_run": self.to_run,
            "seconds": round(self.seconds, 3),
        }


def check_run(ctx: RunContext, sources: list[str], *, progress: Progress = lambda _line: None) -> CheckReport:
    """Step 3 without its writing: every row converted and its request checked as the workers would
    (with `--reuse-from`, step 2 too: each request looked up in the named runs); nothing is written
    to the store, and every temporary file goes."""
    started = time.monotonic()
    files = resolve_sources(sources)
    total = sum(count_rows(f, ctx.spec.input.max_line_bytes) for f in files)
    errors = ErrorWriter(strict=False, several_files=len(files) > 1)
    requests = RequestCheck(ctx.spec)
    reuse: ReusePlan | None = None
    try:
        if ctx.spec.reuse.runs and total:
            reuse = _plan_reuse(ctx, files, total, _answer_keys(ctx.spec), False, progress, requests, errors)
        else:
            convert_into(ctx, files, total, NoChunks(), errors, False, progress, requests=requests)
    finally:
        errors.discard()
        if reuse is not None:
            reuse.discard()
    report = CheckReport(ctx.spec.run, total, requests, errors.count, errors.first, time.monotonic() - started)
    if reuse is not None:
        report.reused, report.to_run = reuse.count, reuse.good - reuse.count
    return report


def _answer_keys(spec: RunSpec) -> AnswerKeys | PoolKeys:
    """Each request's answer key: under its model pool's context in a run of several models or a sweep."""
    return PoolKeys(spec) if spec.models or spec.sweep.arms else AnswerKeys(spec)


def prepare_run(
    ctx: RunContext,
    sources: list[str],
    *,
    strict: bool = False,
    check: bool = True,
    progress: Progress = lambda _line: None,
) -> PrepareReport:
    """Steps 1-4; with `check` (the default) every request is checked as the workers would, and an
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
    keys = _answer_keys(spec)
    requests = RequestCheck(spec) if check else None
    reuse: ReusePlan | None = None
    chunker: Chunker | None = None
    # A pilot (input.limit): its stratified sample is the run's whole input, numbered from 0.
    pilot = _pilot_rows(ctx, files, total, progress) if spec.input.limit and total > spec.input.limit else None
    rows = total if pilot is None else len(pilot)
    try:  # every temporary file of the steps goes in the end, a refused reuse included
        reuse = _plan_reuse(ctx, files, rows, keys, strict, progress, requests, only=pilot) if spec.reuse.runs else None
        chunker = compose(ctx, rows, len(files), reuse, progress)
        # Reusing, the first pass (_plan_reuse) checked the requests already.
        checked = requests if reuse is None else None
        rows_in = convert_into(ctx, files, total, chunker, errors, strict, progress, requests=checked, only=pilot)
        _stop_if_refused(checked)
        entries = chunker.finish().close()
        _check_some_rows(entries, rows, errors, reuse.count if reuse else 0)
        identity = input_identity(ctx.spec, files)
        # Recorded only now: a prepare that failed leaves the run's spec free to be corrected.
        ctx.freeze()
        errors_key = errors.upload(ctx)
        if reuse is not None:
            reuse.upload(ctx)
    finally:
        if reuse is not None:
            reuse.discard()
        if chunker is not None:
            chunker.discard()
        errors.discard()
    reused: dict[str, Any] = {"reused": reuse.count if reuse else 0, "sampled_from": None if pilot is None else total}
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
    errors: ErrorWriter | None = None,
    *,
    only: set[int] | None = None,
) -> ReusePlan:
    """Step 2 (reuse.py steps 1-2): every good row's key, looked up in the runs `reuse.from` names.
    This first pass also checks the requests (`requests`), so a refused one stops before any lookup.
    A sweep keys a request per row and arm, at its place in the space of position x arm. Its bad
    rows go to `errors` (`--check`), else nowhere: the second pass sets them aside."""
    arms = len(ctx.spec.sweep.arms)
    slots = total * max(arms, 1)
    # Only a one-model run's chunks hold its input rows in order: a grown table is read whole otherwise.
    grown = _grown(ctx, files, keys, progress) if isinstance(keys, AnswerKeys) and only is None else None
    collected = KeyCollector(keys, slots)
    own_errors = errors is None
    if errors is None:
        errors = ErrorWriter(strict, several_files=len(files) > 1)
    try:
        if grown is None:
            convert_into(ctx, files, total, collected, errors, strict, progress, requests=requests, only=only)
        else:
            # Only the appended rows are read and keyed; the older ones come keyed from the run that read them.
            collected.add_records(old_rows_keyed(ctx, grown))
            appended = [replace(files[0], since=grown.since)]
            convert_into(
                ctx, appended, total - grown.rows, collected, errors, strict, progress,
                requests=requests, first_position=grown.rows,
            )  # fmt: skip
            progress(f"keyed {total - grown.rows:,} appended rows; {grown.rows:,} older rows keyed by {grown.run}")
        _stop_if_refused(requests)
        plan = plan_reuse(ctx, collected, slots)
    finally:
        if own_errors:
            errors.discard()
        collected.discard()
    of = f"{slots:,} requests ({total:,} rows x {arms} arms)" if arms else f"{total:,} rows"
    progress(
        f"{plan.count:,} of {of} answered by {', '.join(ctx.spec.reuse.runs)}"
        + (
            f"; {plan.sampled_skipped:,} more were, but they sample (temperature > 0, no seed) and run again "
            "(--reuse-sampled, or reuse.sampled: true, reuses them)"
            if plan.sampled_skipped
            else ""
        )
    )
    return plan


def _pilot_rows(ctx: RunContext, files: list[SourceFile], total: int, progress: Progress) -> set[int]:
    """A pilot's rows (input.limit): a first pass over the input keeps each good row's stratum, and a
    stratified sample of `limit` of them is drawn, seeded by the run's name (the same command picks
    the same rows). Bad rows are never picked: a pilot's input is its sample alone."""
    limit = ctx.spec.input.limit or total
    strata = RowStrata(len(ctx.spec.sweep.arms), ctx.spec.sampling.max_tokens)
    errors = ErrorWriter(strict=False, several_files=len(files) > 1)
    try:
        convert_into(ctx, files, total, strata, errors, False, progress)
    finally:
        errors.discard()
    picked = set(strata.sample(limit, seed=f"pilot:{ctx.layout.run}"))
    progress(f"a pilot of {len(picked):,} rows: a stratified sample of the input's {total:,} (--limit)")
    return picked


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


def _refuse_reuse_in_a_cascade(spec: RunSpec) -> None:
    """A reused first-stage answer is in no chunk: the later stages would never see it to escalate it."""
    if spec.sweep.cascade and spec.reuse.runs:
        raise InputError(
            "reuse.from (--reuse-from) with a cascade (sweep.cascade) is not supported",
            hint="run the cascade without --reuse-from",
        )


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
    write_manifest(ctx, entries)
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
    if spec.chunking.group_by_prefix or spec.models or spec.sweep.arms or spec.reuse.runs or spec.input.limit:
        return None  # chunks hold rows in another order, or not all: the files' differences are all there is to say

    def prepared() -> Iterator[bytes]:
        for entry in read_jsonl(ManifestEntry, store.get(layout.manifest).data, layout.manifest):
            with store.open(layout.chunk(entry.chunk)) as f:
                yield from f

    total = sum(count_rows(f, spec.input.max_line_bytes) for f in files)
    errors = ErrorWriter(strict=False, several_files=len(files) > 1)
    compared = PreparedLines(prepared())
    conversion = Conversion(ctx, files, compared, errors, strict=False)
    compared.where = conversion.where
    try:
        conversion.run(total, lambda _line: None)
    finally:
        errors.discard()
    return compared.first_difference()


def _existing_record(ctx: RunContext) -> PrepareRecord | None:
    found = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    return found[0] if found is not None else None

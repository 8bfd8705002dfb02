"""Is this input a grown table? An Iceberg or Delta source that a `--reuse-from` run read at an
older snapshot/version of the same table, with only appends in between (issue 34).

`grown_table` answers for prepare's reuse path: the run and the version it read when the table
only grew since (the rows after that version are the new ones: tables.appended_since), or None
with the reason when it did not (another table, a change that was not an append, another key
digest), which prepare prints: the reuse then reads and keys the whole table, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import PrepareRecord, read_manifest, read_record
from orchestrator.prepare.answers.answer_index import read_index, read_part
from orchestrator.prepare.source_file import SourceFile

if TYPE_CHECKING:
    import numpy.typing as npt

#: Table kinds whose history says what was appended.
INCREMENTAL_KINDS = ("iceberg", "delta")


@dataclass(frozen=True)
class Grown:
    """The table grew by appends only since `run` read it at `since` (`rows` rows then)."""

    run: str
    since: str
    rows: int


def grown_table(ctx: RunContext, files: list[SourceFile], key_digest: str | None) -> tuple[Grown | None, str]:
    """(the earlier read this input grew from, or None; a line saying which, or why not)."""
    if len(files) != 1 or files[0].kind not in INCREMENTAL_KINDS:
        return None, ""
    source = files[0]
    reasons = []
    for run in ctx.spec.reuse.runs:
        found = read_record(ctx.store, RunLayout(run).prepare_record, PrepareRecord)
        then = _same_table(found[0], source) if found is not None else None
        if found is None or then is None:
            continue
        if found[0].key_digests:
            # Its chunks hold requests per model or arm: their rows are not its input rows in order.
            reasons.append(f"run {run} is of several models or a sweep")
            continue
        if found[0].key_digest != key_digest:
            reasons.append(f"run {run} keyed its answers otherwise (model, template or sampling changed)")
            continue
        if found[0].errors or found[0].reused or found[0].identity.get("chunking", {}).get("group_by_prefix"):
            # Its chunks' rows are then not its input rows in order: their positions are not first + row.
            reasons.append(f"run {run} set rows aside, reused rows itself or grouped them by prefix")
            continue
        since = str(then["version"])
        why = _not_only_appended(source, since)
        if why is None:
            grown = Grown(run, since, int(then.get("size", 0)))
            added = source.size - grown.rows
            return (
                grown,
                f"{source.uri} grew by {added:,} rows (appends only) since run {run} read {_at(source, since)}",
            )
        reasons.append(f"since run {run} read {_at(source, since)}: {why}")
    if not reasons:
        return None, ""
    return None, f"{source.uri}: the whole table is read and keyed again ({'; '.join(reasons)})"


def old_rows_keyed(ctx: RunContext, grown: Grown) -> npt.NDArray[Any]:
    """The rows of the older version that `grown.run` answered, as reuse.KeyCollector spills them
    (key, input position, not sampling), from its answer index and manifest, without reading or
    keying a row: its chunks hold its input rows in order (no row set aside, none reused), so the
    row `row` of a chunk is input position `first + row`. Every older row is greedy here: prepare
    takes this path only when the spec does not sample, or reuse.sampled allows it."""
    import numpy as np

    from orchestrator.prepare.answers.reuse import spilled_key_dtype

    layout = RunLayout(grown.run)
    index = read_index(ctx.store, layout)
    # An index record's chunk number is the chunk's place in its run's manifest (as collect_reuse reads it).
    manifest = read_manifest(ctx.store, layout)
    own = index.runs.index(grown.run) if grown.run in index.runs else -1
    starts = np.array([-1 if e.first is None else e.first for e in manifest], dtype=np.int64)
    blocks = []
    for part in index.parts:
        answered = read_part(ctx.store, layout, part)
        answered = answered[answered["run"] == own]
        position = starts[answered["chunk"].astype(np.int64)] + answered["row"].astype(np.int64)
        keep = (starts[answered["chunk"].astype(np.int64)] >= 0) & (position < grown.rows)
        block = np.zeros(int(np.count_nonzero(keep)), dtype=spilled_key_dtype())
        block["hi"], block["lo"], block["position"] = answered["hi"][keep], answered["lo"][keep], position[keep]
        blocks.append(block)
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=spilled_key_dtype())


def _same_table(record: PrepareRecord, source: SourceFile) -> dict[str, Any] | None:
    """The earlier run's record of this table at an older version, else None."""
    sources = record.identity.get("sources") or []
    if len(sources) != 1:
        return None
    then = sources[0]
    digest = str(then.get("digest", ""))
    same_table = digest.rsplit("@", 1)[0] == f"{source.kind}:{source.etag}"
    if not same_table or then.get("version") in (None, source.version):
        return None
    return dict(then)


def _not_only_appended(source: SourceFile, since: str) -> str | None:
    """None when every commit after `since` up to the pinned version only appended, else why not."""
    from orchestrator.prepare.table_sources.tables import appended_since

    try:
        # The generator checks the history before its first batch: one batch at most is read here.
        rows = appended_since(source, since, [])
        next(rows, None)
        del rows
    except InputError as error:
        return error.message
    return None


def _at(source: SourceFile, since: str) -> str:
    return f"{'snapshot' if source.kind == 'iceberg' else 'version'} {since}"

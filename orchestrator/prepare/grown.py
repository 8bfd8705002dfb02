"""Is this input a grown table? An Iceberg or Delta source that a `--reuse-from` run read at an
older snapshot/version of the same table, with only appends in between (issue 34).

`grown_table` answers for prepare's reuse path: the run and the version it read when the table
only grew since (the rows after that version are the new ones: tables.appended_since), or None
with the reason when it did not (another table, a change that was not an append, another key
digest), which prepare prints: the reuse then reads and keys the whole table, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.context import RunContext
from orchestrator.core.errors import InputError
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import PrepareRecord, read_record
from orchestrator.prepare.sources import SourceFile

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
        if then is None:
            continue
        if found is not None and found[0].key_digest != key_digest:
            reasons.append(f"run {run} keyed its answers otherwise (model, template or sampling changed)")
            continue
        since = str(then["version"])
        why = _not_only_appended(source, since)
        if why is None:
            grown = Grown(run, since, int(then.get("size", 0)))
            added = source.size - grown.rows
            return grown, f"{source.uri} grew by {added:,} rows (appends only) since run {run} read {_at(source, since)}"
        reasons.append(f"since run {run} read {_at(source, since)}: {why}")
    if not reasons:
        return None, ""
    return None, f"{source.uri}: the whole table is read and keyed again ({'; '.join(reasons)})"


def _same_table(record: PrepareRecord, source: SourceFile) -> dict[str, object] | None:
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
    from orchestrator.prepare.tables import appended_since

    try:
        # The generator checks the history before its first batch; closing it reads no data file.
        rows = appended_since(source, since, [])
        next(rows, None)
        rows.close()
    except InputError as error:
        return error.message
    return None


def _at(source: SourceFile, since: str) -> str:
    return f"{'snapshot' if source.kind == 'iceberg' else 'version'} {since}"

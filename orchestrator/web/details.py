"""What a run's page shows beyond its status: each worker's log tail and last error, a few answers,
and a few error rows, read cheaply once per status reading.

1. Logs: each worker's newest local log (runview/runs.py, what `orch logs` prints), its last
   TAIL_BYTES only: the last LOG_LINES lines and the last error line the local backend quotes
   when a job fails (backends/local.py). A SkyPilot worker's log is on its machine: the page
   names the command that shows it (the status's `log`).
2. Samples: the first SAMPLES answers of the chunk that finished first (the stats listing names
   it; its done marker, then its first part: 2 GETs and one listing).
3. Error rows: from the chunks whose stats count errors (at most ERROR_CHUNKS markers read), only
   the parts their marker counts errors in; then the rows prepare set aside (prepare-errors.jsonl,
   its first lines only).
Everything here is user data (model outputs, log lines): the template escapes it, never marks it safe.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.backends.local import last_error_in, read_log_end
from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.protocol.checkpoints import read_chunk_stats
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import PrepareError, read_marker
from orchestrator.core.records.base import iter_jsonl
from orchestrator.core.store import NotFound, StoreError
from orchestrator.runview.runs import latest_logs, log_files
from orchestrator.runview.status import RunStatus

#: Lines of each worker's log shown, and how much of its end is read for them and its last error.
LOG_LINES, TAIL_BYTES = 12, 64 * 1024
#: Answers and error rows shown, chunks whose markers are read for error rows, characters of each.
SAMPLES, ERRORS, ERROR_CHUNKS, TEXT_CHARS = 3, 5, 3, 600


@dataclass(frozen=True)
class WorkerLog:
    worker: str
    #: The log file, or the command that shows it (a SkyPilot worker's: `sky jobs logs JOB`).
    where: str
    tail: list[str] = field(default_factory=list)
    last_error: str | None = None


@dataclass(frozen=True)
class Row:
    """One output row as the page shows it: its id, where it is, and its answer or error."""

    custom_id: str | None
    where: str
    text: str


@dataclass(frozen=True)
class RunDetails:
    logs: list[WorkerLog] = field(default_factory=list)
    samples: list[Row] = field(default_factory=list)
    errors: list[Row] = field(default_factory=list)
    #: What could not be read (the store's trouble must not hide the status): said on the page.
    problems: list[str] = field(default_factory=list)


def read_details(ctx: RunContext, status: RunStatus) -> RunDetails:
    """The run's log tails, sample answers and error rows (see the module's steps)."""
    problems: list[str] = []
    samples: list[Row] = []
    errors: list[Row] = []
    try:
        samples, errors = _outputs(ctx, status)
    except (OrchError, StoreError, OSError, ValueError) as e:
        problems.append(f"cannot read sample outputs: {e}")
    return RunDetails(worker_logs(ctx, status), samples, errors, problems)


def worker_logs(ctx: RunContext, status: RunStatus) -> list[WorkerLog]:
    """Step 1: each worker's log tail and last error, in the status's worker order (then workers
    with a log here that the status does not name)."""
    local = latest_logs(log_files(ctx))
    out = []
    for w in status.workers:
        path = local.pop(w.worker, None)
        if path is not None:
            out.append(_tail(w.worker, path))
        elif w.log or w.failure_reason:
            out.append(WorkerLog(w.worker, w.log or "-", last_error=w.failure_reason))
    return out + [_tail(worker, path) for worker, path in sorted(local.items())]


def _tail(worker: str, path: Path) -> WorkerLog:
    text = read_log_end(path, TAIL_BYTES) or ""
    lines = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    if len(text.encode()) >= TAIL_BYTES and lines:
        lines = lines[1:]  # the first line read may be cut: it started before the tail
    return WorkerLog(worker, str(path), [_cut(line) for line in lines[-LOG_LINES:]], last_error_in(text))


def _outputs(ctx: RunContext, status: RunStatus) -> tuple[list[Row], list[Row]]:
    """Steps 2 and 3: answers of the first finished chunk, then error rows."""
    stats = sorted(read_chunk_stats(ctx.store, ctx.layout).items(), key=lambda item: item[1][0])
    samples = _rows_of(ctx, stats[0][0], SAMPLES, errors_only=False) if stats else []
    errors: list[Row] = []
    for chunk, _ in [item for item in stats if item[1][1].errors][:ERROR_CHUNKS]:
        errors += _rows_of(ctx, chunk, ERRORS - len(errors), errors_only=True)
    if len(errors) < ERRORS and status.rows.set_aside:
        errors += _set_aside(ctx, ERRORS - len(errors))
    return samples, errors


def _rows_of(ctx: RunContext, chunk: str, want: int, *, errors_only: bool) -> list[Row]:
    """The first `want` rows (or error rows) of a done chunk, reading its parts (one per
    checkpoint) only until there are enough; none for a chunk without a marker (stats are a cache)."""
    marker = read_marker(ctx.store, ctx.layout, chunk) if want > 0 else None
    if marker is None:
        return []
    rows: list[Row] = []
    for part in marker.parts:
        if len(rows) >= want or (errors_only and not part.errors):
            continue
        lines = iter_part_lines(ctx.store.get(part.key).data, marker.output_format)
        chosen = (line for line in lines if line.failed or not errors_only)
        rows += [_row(line, chunk) for line in itertools.islice(chosen, want - len(rows))]
    return rows


def _row(line: BatchOutputLine, chunk: str) -> Row:
    if line.error is not None:
        text = f"{line.error.code}: {line.error.message}"
    else:
        text = line.text() or "(an answer without text: embeddings, or a body of another shape)"
    return Row(line.custom_id, f"{chunk} row {line.row}", _cut(text))


def _set_aside(ctx: RunContext, n: int) -> list[Row]:
    """The first `n` rows prepare set aside, read from the start of prepare-errors.jsonl only."""
    try:
        with ctx.store.open(ctx.layout.prepare_errors) as f:
            head = list(itertools.islice((line for line in f if line.strip()), n))
    except NotFound:
        return []
    return [
        Row(e.custom_id, f"{e.location} (set aside at prepare)", _cut(e.error))
        for e in iter_jsonl(PrepareError, head, ctx.layout.prepare_errors)
    ]


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"

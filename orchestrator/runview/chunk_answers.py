"""A finished chunk's answers, read from the parts its done marker lists and checked against it."""

from __future__ import annotations

import hashlib
from typing import Protocol

from orchestrator.core.errors import CorruptOutput, CorruptRecord
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import DoneMarker, ManifestEntry, read_marker
from orchestrator.core.store import Store


class AnswerTally(Protocol):
    """What counts a collect's chunks and duplicate lines (collect/report.CollectReport)."""

    chunks_complete: int
    duplicates: int

    def note(self, kind: str, custom_id: str | None) -> None: ...


def redo_hint(layout: RunLayout, chunk: str) -> str:
    return (
        f"`orch redo --run {layout.run} --chunk {chunk}` runs the chunk again "
        "(then `orch resume --follow` if no worker is running)"
    )


def done_marker(store: Store, layout: RunLayout, chunk: str) -> DoneMarker | None:
    """The chunk's marker (None while not done); a corrupt one is damage `orch redo` repairs."""
    try:
        return read_marker(store, layout, chunk)
    except CorruptRecord as e:
        raise CorruptOutput(
            f"the done marker of {chunk} is corrupt: {e.message}", hint=redo_hint(layout, chunk)
        ) from None


def chunk_answers(
    store: Store, layout: RunLayout, entry: ManifestEntry, report: AnswerTally | None = None
) -> dict[int, BatchOutputLine] | None:
    """collect's steps 1-2: the chunk's output lines by row, from the parts its done marker lists
    (None when it has none). `report` counts complete chunks and duplicate lines; without it the
    first line of a row wins."""
    marker = done_marker(store, layout, entry.chunk)
    if marker is None:
        return None
    answers: dict[int, BatchOutputLine] = {}
    if report is not None:
        report.chunks_complete += 1
    for part in marker.parts:
        data = store.get(part.key).data
        if hashlib.sha256(data).hexdigest() != part.sha256:
            raise CorruptOutput(
                f"{part.key} does not match the checksum in its done marker",
                where=layout.done(entry.chunk),
                hint=f"the store was changed outside orch: {redo_hint(layout, entry.chunk)}",
            )
        for part_line in iter_part_lines(data, marker.output_format):
            if part_line.row in answers:
                if report is None:
                    continue
                report.duplicates += 1
                report.note("duplicates", part_line.custom_id)
                continue
            answers[part_line.row] = part_line
    return answers

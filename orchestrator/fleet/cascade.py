"""Running a cascade (spec `sweep.cascade`) stage by stage, once stage 0 (the run itself) is done.

1. Stage 0 is the run itself: every row, answered by the cascade's first model (prepare routes
   every row to it).
2. Once stage n-1 is done, stage n's requests are made from its answers (planning/escalation.py)
   and recorded once (record_stage): a controller killed after that reads the record back, so no
   row is escalated twice.
3. Stage n runs as a run of its own, `<run>.stage-<n>` (runview/cascade.py): its input is the
   recorded request lines (openai-batch), its one model cascade[n]. Prepare, plan and launch take
   it as any run, each step skipping what is done, so `orch run` started again continues where it
   stopped.
4. Collect writes the run's rows in input order, each with the answer of the last stage that
   answered it (collect/cascade.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.core.context import RunContext
from orchestrator.core.errors import PreconditionFailed
from orchestrator.core.layout import RunLayout
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.store import Store
from orchestrator.planning.escalation import Escalated, next_stage
from orchestrator.runview.cascade import (
    read_stage,
    stage_answers,
    stage_chunks,
    stage_context,
    stage_key,
    stage_prefix,
    stage_run,
)


def record_stage(store: Store, run_prefix: str, stage: int, rows: Sequence[Escalated]) -> list[Escalated]:
    """Record stage `stage`'s requests once: the first record wins, and every later call (a
    controller started again after a crash) gets that record back, never a second set of rows."""
    key = stage_key(run_prefix, stage)
    data = json.dumps([[r.position, r.line, r.reason] for r in rows], ensure_ascii=False).encode()
    try:
        store.put_if_absent(key, data)
        return list(rows)
    except PreconditionFailed:
        return read_stage(store, run_prefix, stage) or []


def escalate(ctx: RunContext, stage: int) -> list[Escalated]:
    """Stage `stage`'s requests (stage > 0): read back when recorded, else made from stage n-1's
    finished answers and recorded once (the first record wins)."""
    store, prefix = ctx.store, stage_prefix(ctx.layout)
    recorded = read_stage(store, prefix, stage)
    if recorded is not None:
        return recorded
    before = read_stage(store, prefix, stage - 1) if stage > 1 else None
    layout = RunLayout(stage_run(ctx.layout.run, stage - 1))
    when, model = ctx.spec.sweep.escalate_when, ctx.spec.sweep.cascade[stage]
    if before is None:  # stage 0: chunk by chunk, holding only the rows that go on
        schemas = RunSchemas.of(ctx.spec.input.response_format)  # stage 0's lines reference the run's schema
        rows = [
            row
            for requests, answers in stage_chunks(store, layout, 0)
            for row in next_stage(requests, answers, when, model, schemas)
        ]
        rows.sort(key=lambda row: row.position)
    elif before:
        rows = next_stage([(r.position, r.line) for r in before], stage_answers(store, layout, stage - 1), when, model)
    else:
        rows = []  # nothing reached stage n-1: nothing goes on
    return record_stage(store, prefix, stage, rows)


def run_stages(
    ctx: RunContext, run_stage: Callable[[RunContext, list[str]], None], echo: Callable[[str], None]
) -> None:
    """Steps 2-3 for every stage after the first, once stage 0 is done: `run_stage` prepares,
    launches and follows a stage's run to its end (what `orch run` does for the run itself)."""
    cascade = ctx.spec.sweep.cascade
    for stage in range(1, len(cascade)):
        rows = escalate(ctx, stage)
        echo(f"cascade stage {stage}: {len(rows):,} row(s) escalated to {cascade[stage]!r}")
        if not rows:
            continue
        with tempfile.TemporaryDirectory(prefix="orch-cascade-") as folder:
            # Named and filled the same every time: prepare knows its input again by name and content.
            source = Path(folder) / f"stage-{stage}.jsonl"
            source.write_text("".join(row.line + "\n" for row in rows), encoding="utf-8")
            run_stage(stage_context(ctx, stage), [str(source)])

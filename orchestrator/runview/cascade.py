"""A cascade (spec `sweep.cascade`) as the store holds it: each stage's run, its recorded requests, its answers.

Stage 0 is the run itself; stage n > 0 is a run of its own, `<run>.stage-<n>`, whose input is the
requests recorded when stage n-1 finished (`<run>/cascade/stage-<n>.json`, written once by
fleet/cascade.py). `orch status` shows a row per stage; collect takes each row's last answer
(collect/cascade.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from orchestrator.core.context import RunContext
from orchestrator.core.errors import IncompleteRun, NotFound
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.records import PrepareRecord, read_manifest, read_record
from orchestrator.core.spec import InputSpec, ReuseSpec, RunSpec, SweepSpec
from orchestrator.core.store import Store
from orchestrator.planning.escalation import Escalated
from orchestrator.runview.chunk_answers import chunk_answers
from orchestrator.runview.positions import InputPositions
from orchestrator.runview.sections import StageView

#: A stage's answers by custom_id.
Answers = dict[str, BatchOutputLine]


def stage_run(run: str, stage: int) -> str:
    """The run that answers a cascade's stage: the run itself for stage 0."""
    return run if stage == 0 else f"{run}.stage-{stage}"


def stage_spec(spec: RunSpec, stage: int) -> RunSpec:
    """Stage n's spec (n > 0): the run's, with cascade[n] its one model and the recorded request
    lines its input. Made the same way every time, so a restarted controller freezes no change."""
    model = spec.sweep.cascade[stage]
    update = {
        "run": stage_run(spec.run or "", stage),
        "models": {model: spec.models[model]},
        "sweep": SweepSpec(),
        "input": InputSpec(format="openai-batch", max_line_bytes=spec.input.max_line_bytes),
        "reuse": ReuseSpec(),
    }
    return spec.model_copy(update=update, deep=True)


def stage_context(ctx: RunContext, stage: int) -> RunContext:
    spec = stage_spec(ctx.spec, stage)
    return RunContext(spec, ctx.store, RunLayout(spec.run or ""))


def check_stage_names(ctx: RunContext) -> None:
    """Every later stage's run name is valid (`<run>.stage-<n>`, at most 100 characters)."""
    for stage in range(1, len(ctx.spec.sweep.cascade)):
        stage_context(ctx, stage)


def stage_prefix(layout: RunLayout) -> str:
    return layout.root.rstrip("/")


def stage_key(run_prefix: str, stage: int) -> str:
    return f"{run_prefix}/cascade/stage-{stage}.json"


def read_stage(store: Store, run_prefix: str, stage: int) -> list[Escalated] | None:
    """Stage `stage`'s recorded requests, None while it is not recorded (stage n-1 not yet done)."""
    try:
        data = store.get(stage_key(run_prefix, stage)).data
    except NotFound:
        return None
    return [Escalated(p, line, reason) for p, line, reason in json.loads(data)]


def stage_chunks(store: Store, layout: RunLayout, stage: int) -> Iterator[tuple[list[tuple[int, str]], Answers]]:
    """A finished stage's chunks, one at a time (memory stays bounded by a chunk): each row's place
    in the stage's input and its request line, and the chunk's answers by custom_id."""
    found = read_record(store, layout.prepare_record, PrepareRecord)
    if found is None:
        raise IncompleteRun(f"cascade stage {stage} (run {layout.run!r}) is not prepared", hint="orch run it again")
    positions = InputPositions(store, layout, found[0].rows + found[0].errors)
    for entry in read_manifest(store, layout):
        lines = chunk_answers(store, layout, entry)
        if lines is None:
            raise IncompleteRun(
                f"cascade stage {stage} (run {layout.run!r}): chunk {entry.chunk} is not done",
                hint="`orch run` with the same arguments finishes it",
            )
        first = entry.first or 0
        places = positions.of(entry) if entry.positions else range(first, first + entry.rows)
        requests = store.get(layout.chunk(entry.chunk)).data.decode().splitlines()
        answers = {line.custom_id: line for line in lines.values() if line.custom_id is not None}
        yield list(zip(places, requests, strict=False)), answers


def stage_answers(store: Store, layout: RunLayout, stage: int) -> Answers:
    """Every answer of a finished later stage (its rows are the escalated ones only)."""
    return {cid: line for _, answers in stage_chunks(store, layout, stage) for cid, line in answers.items()}


def stages_status(store: Store, layout: RunLayout, cascade: list[str]) -> list[StageView]:
    """`orch status`'s view of a cascade, a row per stage: its model and run, the rows it has to
    answer and has answered (in done chunks), and the rows it passed on (None until recorded)."""
    stages: list[StageView] = []
    for stage, model in enumerate(cascade):
        run = RunLayout(stage_run(layout.run, stage))
        entries = read_manifest(store, run) if store.head(run.manifest) is not None else []
        rows: int | None = sum(e.rows for e in entries)
        if stage > 0 and not entries:
            recorded = read_stage(store, stage_prefix(layout), stage)
            rows = None if recorded is None else len(recorded)
        answered = sum(e.rows for e in entries if store.head(run.done(e.chunk)) is not None)
        passed = read_stage(store, stage_prefix(layout), stage + 1) if stage + 1 < len(cascade) else []
        escalated = None if passed is None else len(passed)
        stages.append(
            StageView(stage=stage, model=model, run=run.run, rows=rows, answered=answered, escalated=escalated)
        )
    return stages

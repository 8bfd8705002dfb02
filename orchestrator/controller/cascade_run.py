"""Running a cascade (spec `sweep.cascade`) stage by stage, and collecting each row's last answer.

1. Stage 0 is the run itself: every row, answered by the cascade's first model (prepare routes
   every row to it).
2. Once stage n-1 is done, stage n's requests are made from its answers (cascade.next_stage) and
   recorded once (cascade.record_stage): a controller killed after that reads the record back, so
   no row is escalated twice.
3. Stage n runs as a run of its own, `<run>.stage-<n>`: its input is the recorded request lines
   (openai-batch), its one model cascade[n]. Prepare, plan and launch take it as any run, each
   step skipping what is done, so `orch run` started again continues where it stopped.
4. Collect writes the run's rows in input order, each with the answer of the last stage that
   answered it (CascadeAnswers, given to collect).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.controller.cascade import Escalated, Final, final_answers, next_stage, read_stage, record_stage
from orchestrator.controller.chunk_answers import chunk_answers
from orchestrator.controller.input_order import InputPositions
from orchestrator.controller.token_cost import TokenCounts
from orchestrator.core.context import RunContext
from orchestrator.core.errors import IncompleteRun
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.records import PrepareRecord, read_manifest, read_record
from orchestrator.core.spec import InputSpec, ReuseSpec, RunSpec, SweepSpec
from orchestrator.core.store import Store

if TYPE_CHECKING:
    from orchestrator.controller.collect import CollectReport

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


def _prefix(layout: RunLayout) -> str:
    return layout.root.rstrip("/")


def _chunks(store: Store, layout: RunLayout, stage: int) -> Iterator[tuple[list[tuple[int, str]], Answers]]:
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


def _answers(store: Store, layout: RunLayout, stage: int) -> Answers:
    """Every answer of a finished later stage (its rows are the escalated ones only)."""
    return {cid: line for _, answers in _chunks(store, layout, stage) for cid, line in answers.items()}


def escalate(ctx: RunContext, stage: int) -> list[Escalated]:
    """Stage `stage`'s requests (stage > 0): read back when recorded, else made from stage n-1's
    finished answers and recorded once (the first record wins)."""
    store, prefix = ctx.store, _prefix(ctx.layout)
    recorded = read_stage(store, prefix, stage)
    if recorded is not None:
        return recorded
    before = read_stage(store, prefix, stage - 1) if stage > 1 else None
    layout = RunLayout(stage_run(ctx.layout.run, stage - 1))
    when, model = ctx.spec.sweep.escalate_when, ctx.spec.sweep.cascade[stage]
    if before is None:  # stage 0: chunk by chunk, holding only the rows that go on
        rows = [
            row for requests, answers in _chunks(store, layout, 0) for row in next_stage(requests, answers, when, model)
        ]
        rows.sort(key=lambda row: row.position)
    elif before:
        rows = next_stage([(r.position, r.line) for r in before], _answers(store, layout, stage - 1), when, model)
    else:
        rows = []  # nothing reached stage n-1: nothing goes on
    return record_stage(store, prefix, stage, rows)


def _custom_id(line: str) -> str:
    return str(json.loads(line)["custom_id"])


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


def stages_status(store: Store, layout: RunLayout, cascade: list[str]) -> list[dict[str, Any]]:
    """`orch status`'s view of a cascade, a row per stage: its model and run, the rows it has to
    answer and has answered (in done chunks), and the rows it passed on (None until recorded)."""
    stages: list[dict[str, Any]] = []
    for stage, model in enumerate(cascade):
        run = RunLayout(stage_run(layout.run, stage))
        entries = read_manifest(store, run) if store.head(run.manifest) is not None else []
        rows: int | None = sum(e.rows for e in entries)
        if stage > 0 and not entries:
            recorded = read_stage(store, _prefix(layout), stage)
            rows = None if recorded is None else len(recorded)
        answered = sum(e.rows for e in entries if store.head(run.done(e.chunk)) is not None)
        passed = read_stage(store, _prefix(layout), stage + 1) if stage + 1 < len(cascade) else []
        escalated = None if passed is None else len(passed)
        stages.append({"stage": stage, "model": model, "run": run.run, "rows": rows, "answered": answered})
        stages[-1]["escalated"] = escalated
    return stages


@dataclass
class CascadeAnswers:
    """For collect: the escalated rows' final answers, and each stage's rows answered and passed on."""

    finals: dict[str, Final]
    #: Per model, in cascade order: rows it answered, and rows of those it passed on.
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    tokens: TokenCounts = field(default_factory=TokenCounts)
    #: The request lines of the rows whose final answer failed, for collect's retry file.
    failed: list[bytes] = field(default_factory=list)

    @classmethod
    def load(cls, store: Store, layout: RunLayout) -> CascadeAnswers | None:
        """None for a run that is no cascade; an incomplete cascade (a stage not recorded or not
        finished) is refused, naming the stage, rather than handing out an earlier stage's answers."""
        stored = read_stored_spec(store, layout)
        sweep = (stored[0].get("sweep") or {}) if stored else {}
        cascade: list[str] = sweep.get("cascade") or []
        if not cascade:
            return None
        stages: list[tuple[str, Answers]] = [(cascade[0], {})]
        reasons, sizes, requests = [], [], {}
        for stage in range(1, len(cascade)):
            rows = read_stage(store, _prefix(layout), stage)
            if rows is None:
                raise IncompleteRun(
                    f"cascade stage {stage} ({cascade[stage]!r}) of run {layout.run!r} is not made yet",
                    hint="`orch run` with the same arguments runs the cascade's later stages",
                )
            answers = _answers(store, RunLayout(stage_run(layout.run, stage)), stage) if rows else {}
            stages.append((cascade[stage], answers))
            reasons.append({_custom_id(r.line): r.reason for r in rows})
            requests.update({_custom_id(r.line): r.line for r in rows})  # the last stage's request wins
            sizes.append(len(rows))
        done = cls(final_answers(stages, reasons))
        found = read_record(store, layout.prepare_record, PrepareRecord)
        answered = [found[0].rows if found else 0, *sizes]
        for number, model in enumerate(cascade):
            passed = answered[number + 1] if number + 1 < len(answered) else 0
            done.counts[model] = {"answered": answered[number], "escalated": passed}
        for _, answers in stages[1:]:
            for line in answers.values():
                usage = line.usage()
                done.tokens.add(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
        done.failed = [(requests[cid] + "\n").encode() for cid, final in done.finals.items() if final.line.failed]
        return done

    def finish(self, report: CollectReport) -> None:
        """Collect's report: the later stages' tokens and failed final answers, and the per-model counts."""
        t = self.tokens
        report.tokens.add(t.prompt_tokens, t.cached_tokens, t.generated_tokens)
        report.errors += len(self.failed)
        report.cascade = self.counts

    def final(self, line: BatchOutputLine) -> tuple[BatchOutputLine, Final | None]:
        """The row's answer in the output: the last stage's that answered it (`line` is stage 0's)."""
        found = self.finals.get(line.custom_id or "")
        return (line, None) if found is None else (found.line, found)

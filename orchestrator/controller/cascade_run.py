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
from collections.abc import Callable
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
        "input": InputSpec(format="openai-batch"),
        "reuse": ReuseSpec(),
    }
    return spec.model_copy(update=update, deep=True)


def stage_context(ctx: RunContext, stage: int) -> RunContext:
    spec = stage_spec(ctx.spec, stage)
    return RunContext(spec, ctx.store, RunLayout(spec.run or ""))


def _prefix(layout: RunLayout) -> str:
    return layout.root.rstrip("/")


def _answers(store: Store, layout: RunLayout, stage: int) -> tuple[dict[str, int], dict[str, BatchOutputLine]]:
    """A finished stage's rows: custom_id -> its input position (where known), and its answers by custom_id."""
    found = read_record(store, layout.prepare_record, PrepareRecord)
    if found is None:
        raise IncompleteRun(f"cascade stage {stage} (run {layout.run!r}) is not prepared", hint="orch run it again")
    positions = InputPositions(store, layout, found[0].rows + found[0].errors)
    places: dict[str, int] = {}
    answers: dict[str, BatchOutputLine] = {}
    for entry in read_manifest(store, layout):
        lines = chunk_answers(store, layout, entry)
        if lines is None:
            raise IncompleteRun(
                f"cascade stage {stage} (run {layout.run!r}): chunk {entry.chunk} is not done",
                hint="orch run again finishes it",
            )
        rows = positions.of(entry) if entry.positions else range(entry.first or 0, (entry.first or 0) + entry.rows)
        for row, place in enumerate(rows):
            line = lines.get(row)
            if line is not None and line.custom_id is not None:
                places[line.custom_id] = place
                answers[line.custom_id] = line
    return places, answers


def escalate(ctx: RunContext, stage: int) -> list[Escalated]:
    """Stage `stage`'s requests (stage > 0): read back when recorded, else made from stage n-1's
    finished answers and recorded once (the first record wins)."""
    store, prefix = ctx.store, _prefix(ctx.layout)
    recorded = read_stage(store, prefix, stage)
    if recorded is not None:
        return recorded
    before = read_stage(store, prefix, stage - 1) if stage > 1 else None
    if before is not None and not before:
        return record_stage(store, prefix, stage, [])  # nothing reached stage n-1: nothing goes on
    layout = RunLayout(stage_run(ctx.layout.run, stage - 1))
    places, answers = _answers(store, layout, stage - 1)
    if before is None:  # stage 0: its chunks' request lines, at their rows' places in the input
        requests = [(places.get(_custom_id(line), -1), line) for line in _request_lines(store, layout)]
    else:
        requests = [(r.position, r.line) for r in before]
    rows = next_stage(requests, answers, ctx.spec.sweep.escalate_when, ctx.spec.sweep.cascade[stage])
    return record_stage(store, prefix, stage, rows)


def _custom_id(line: str) -> str:
    return str(json.loads(line)["custom_id"])


def _request_lines(store: Store, layout: RunLayout) -> list[str]:
    return [
        raw
        for entry in read_manifest(store, layout)
        for raw in store.get(layout.chunk(entry.chunk)).data.decode().splitlines()
        if raw.strip()
    ]


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
    failed: int = 0

    @classmethod
    def load(cls, store: Store, layout: RunLayout) -> CascadeAnswers | None:
        """None for a run that is no cascade; an incomplete cascade (a stage not recorded or not
        finished) is refused, naming the stage, rather than handing out an earlier stage's answers."""
        stored = read_stored_spec(store, layout)
        sweep = (stored[0].get("sweep") or {}) if stored else {}
        cascade: list[str] = sweep.get("cascade") or []
        if not cascade:
            return None
        stages: list[tuple[str, dict[str, BatchOutputLine]]] = [(cascade[0], {})]
        reasons, sizes = [], []
        for stage in range(1, len(cascade)):
            rows = read_stage(store, _prefix(layout), stage)
            if rows is None:
                raise IncompleteRun(
                    f"cascade stage {stage} ({cascade[stage]!r}) of run {layout.run!r} is not made yet",
                    hint="`orch run` with the same arguments runs the cascade's later stages",
                )
            answers = _answers(store, RunLayout(stage_run(layout.run, stage)), stage)[1] if rows else {}
            stages.append((cascade[stage], answers))
            reasons.append({_custom_id(r.line): r.reason for r in rows})
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
        done.failed = sum(1 for final in done.finals.values() if final.line.failed)
        return done

    def finish(self, report: CollectReport) -> None:
        """Collect's report: the later stages' tokens and failed final answers, and the per-model counts."""
        t = self.tokens
        report.tokens.add(t.prompt_tokens, t.cached_tokens, t.generated_tokens)
        report.errors += self.failed
        report.cascade = self.counts

    def final(self, line: BatchOutputLine) -> tuple[BatchOutputLine, Final | None]:
        """The row's answer in the output: the last stage's that answered it (`line` is stage 0's)."""
        found = self.finals.get(line.custom_id or "")
        return (line, None) if found is None else (found.line, found)

"""A cascade's answers in collect's output: each row's answer is the last stage's that answered it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.collect.report import CollectReport
from orchestrator.core.errors import IncompleteRun
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.records import PrepareRecord, read_record
from orchestrator.core.store import Store
from orchestrator.runview.cascade import Answers, read_stage, stage_answers, stage_prefix, stage_run
from orchestrator.runview.tokens import TokenCounts


@dataclass(frozen=True)
class Final:
    """A row's answer in the output: the last stage's that answered it, and why it was escalated."""

    line: BatchOutputLine
    model: str
    escalated: str | None


def final_answers(
    stages: Sequence[tuple[str, Mapping[str, BatchOutputLine]]], reasons: Sequence[Mapping[str, str]]
) -> dict[str, Final]:
    """Each custom_id's final answer: `stages` are (model, answers by custom_id) in cascade order,
    `reasons[n]` why a custom_id went from stage n to n+1 (the recorded escalations)."""
    finals: dict[str, Final] = {}
    for number, (model, answers) in enumerate(stages):
        for custom_id, line in answers.items():
            why = reasons[number - 1].get(custom_id) if number else None
            finals[custom_id] = Final(line, model, why)
    return finals


def stage_counts(finals: Mapping[str, Final], order: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per model of the cascade: rows it answered, and rows of those it passed on to the next."""
    counts = {model: {"answered": 0, "escalated": 0} for model in order}
    for final in finals.values():
        last = order.index(final.model)
        for number, model in enumerate(order[: last + 1]):
            counts[model]["answered"] += 1
            counts[model]["escalated"] += number < last
    return counts


def _custom_id(line: str) -> str:
    return str(json.loads(line)["custom_id"])


@dataclass
class CascadeAnswers:
    """For collect: the escalated rows' final answers, and each stage's rows answered and passed on."""

    finals: dict[str, Final]
    #: Per model, in cascade order: rows it answered, and rows of those it passed on.
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    tokens: TokenCounts = field(default_factory=TokenCounts)
    #: The request lines of the rows whose final answer failed, for collect's retry file.
    failed: list[bytes] = field(default_factory=list)
    #: The later stages' runs that answered rows (each a run of its own): their answers go into the index.
    stage_runs: list[str] = field(default_factory=list)

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
            rows = read_stage(store, stage_prefix(layout), stage)
            if rows is None:
                raise IncompleteRun(
                    f"cascade stage {stage} ({cascade[stage]!r}) of run {layout.run!r} is not made yet",
                    hint="`orch run` with the same arguments runs the cascade's later stages",
                )
            answers = stage_answers(store, RunLayout(stage_run(layout.run, stage)), stage) if rows else {}
            stages.append((cascade[stage], answers))
            reasons.append({_custom_id(r.line): r.reason for r in rows})
            requests.update({_custom_id(r.line): r.line for r in rows})  # the last stage's request wins
            sizes.append(len(rows))
        done = cls(final_answers(stages, reasons))
        done.stage_runs = [stage_run(layout.run, n) for n, size in enumerate(sizes, start=1) if size]
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

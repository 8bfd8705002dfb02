"""A sweep's arms compared, row by row: how each arm's answers parse, what a row costs, and how far
each arm agrees with the first.

collect hands every line it writes to ArmComparison (`add`); a row's arms (custom_id `<row>#<arm>`,
prepare/sweep.py) are gathered, read as the table reads them (table.AnswerFields: a JSON schema's
fields, typed; the text otherwise), and compared with the first arm's. Per arm:
    rows                the rows with an answer line from the arm (reused rows included)
    errors              error lines (set-aside rows, failed requests)
    parse_errors        answers that came back but are not JSON, or break the schema (a JSON schema run)
    parse_error_rate    parse_errors over the answers that came back (errors left out); None without a schema
    tokens_per_row      prompt + generated tokens per row that has usage (a reused row: its answer's)
    usd_per_row         the arm's $ (runview/arms.py: its share of its pool's cost) per row it ran
    agreement           the first arm excepted: per field, the share of the rows both arms answered
                        and parsed whose values are equal (None when no row was)
    compared            those rows
    rows_differ         rows where one of the two answers parsed and the other not, or a field differs
    differ_examples     the first few of them
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.collect.table import AnswerFields, TableSpec
from orchestrator.core.lines import BatchOutputLine
from orchestrator.prepare.sweep import ARM_SEPARATOR

#: Ids of differing rows kept per arm.
EXAMPLES = 5


@dataclass
class _Answer:
    """An arm's answer to a row, as compared: parsed (no error line, no parse error) or not, its values."""

    parsed: bool
    values: tuple[Any, ...]


@dataclass
class _ArmCounts:
    rows: int = 0
    errors: int = 0
    parse_errors: int = 0
    usage_rows: int = 0
    tokens: int = 0
    compared: int = 0
    equal: list[int] = field(default_factory=list)
    rows_differ: int = 0
    differ_examples: list[str] = field(default_factory=list)


class ArmComparison:
    """Each arm of a sweep against the first, fed every line collect writes."""

    def __init__(self, spec: TableSpec):
        self.arms = spec.arms
        fmt = spec.response_format or {}
        schema = AnswerFields(fmt["json_schema"], set()) if fmt.get("type") == "json_schema" else None
        self.schema = schema
        self.fields = [name for _column, name, _kind in schema.fields] if schema else ([] if spec.pooling else ["text"])
        self.counts = {arm: _ArmCounts(equal=[0] * len(self.fields)) for arm in self.arms}
        #: Rows whose arms are still coming: row id -> arm -> answer.
        self.pending: dict[str, dict[str, _Answer]] = {}

    @classmethod
    def of(cls, spec: TableSpec) -> ArmComparison | None:
        """None for a run that is not a sweep."""
        return cls(spec) if spec.arms else None

    def add(self, line: BatchOutputLine) -> None:
        row, _, arm = (line.custom_id or "").rpartition(ARM_SEPARATOR)
        counts = self.counts.get(arm)
        if counts is None:
            return
        counts.rows += 1
        body = line.response.body if line.response is not None and line.response.body else {}
        if "usage" in body:
            usage = line.usage()
            counts.usage_rows += 1
            counts.tokens += usage.prompt_tokens + usage.completion_tokens
        self.pending.setdefault(row, {})[arm] = self._answer(line, counts)
        if len(self.pending[row]) == len(self.arms):
            self._compare(row, self.pending.pop(row))

    def _answer(self, line: BatchOutputLine, counts: _ArmCounts) -> _Answer:
        if line.failed:
            counts.errors += 1
            return _Answer(False, ())
        if self.schema is None:
            return _Answer(True, () if not self.fields else (line.text(),))
        values, problem = self.schema.parse(line.text(), line.first_choice().get("finish_reason"))
        if problem is not None:
            counts.parse_errors += 1
            return _Answer(False, ())
        return _Answer(True, tuple(values))

    def _compare(self, row: str, answers: dict[str, _Answer]) -> None:
        first = answers.get(self.arms[0])
        for arm in self.arms[1:]:
            answer, counts = answers.get(arm), self.counts[arm]
            if first is None or answer is None:  # an arm with no line (a partial collect): not compared
                continue
            if first.parsed and answer.parsed:
                counts.compared += 1
                same = [a == b for a, b in zip(first.values, answer.values, strict=True)]
                counts.equal = [n + s for n, s in zip(counts.equal, same, strict=True)]
                differs = not all(same)
            else:
                differs = first.parsed != answer.parsed
            if differs:
                counts.rows_differ += 1
                if len(counts.differ_examples) < EXAMPLES:
                    counts.differ_examples.append(row)

    def summary(self, arms: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The comparison (module doc); `arms`: runview's per-arm numbers, for each arm's model and $."""
        for row, answers in list(self.pending.items()):  # rows some arm never answered
            self._compare(row, answers)
        self.pending.clear()
        out: dict[str, Any] = {"first": self.arms[0], "fields": self.fields, "arms": {}}
        for index, (arm, c) in enumerate(self.counts.items()):
            priced = (arms or {}).get(arm) or {}
            ran = (priced.get("rows") or {}).get("done", 0)
            answered = c.rows - c.errors
            out["arms"][arm] = {
                "model": priced.get("model"),
                "rows": c.rows,
                "errors": c.errors,
                "parse_errors": c.parse_errors,
                "parse_error_rate": round(c.parse_errors / answered, 6) if self.schema and answered else None,
                "tokens_per_row": round(c.tokens / c.usage_rows, 2) if c.usage_rows else None,
                "usd_per_row": priced["usd"] / ran if "usd" in priced and ran else None,
                "agreement": None
                if index == 0
                else {
                    name: round(equal / c.compared, 6) if c.compared else None
                    for name, equal in zip(self.fields, c.equal, strict=True)
                },
                "compared": None if index == 0 else c.compared,
                "rows_differ": None if index == 0 else c.rows_differ,
                "differ_examples": [] if index == 0 else c.differ_examples,
            }
        return out

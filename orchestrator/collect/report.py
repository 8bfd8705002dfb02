"""What a collect did: rows written, errors, missing and duplicate rows, tokens, reuse, the table commit."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.tempfiles import Removed
from orchestrator.runview.tokens import TokenCounts

EXAMPLES = 5


@dataclass
class CollectReport:
    out: str
    #: The file's format (jsonl, parquet); `shape` what its rows are (openai lines, or a table).
    format: str
    shape: str = "openai"
    #: False when the output was withheld because rows are missing (collect's `partial`).
    out_written: bool = True
    chunks_total: int = 0
    chunks_complete: int = 0
    #: Every input row: the requests in the chunks and the rows set aside at prepare.
    rows_total: int = 0
    rows_written: int = 0
    #: Error lines written: rows that failed, set-aside rows included.
    errors: int = 0
    #: Rows set aside at prepare, answered with error lines.
    set_aside: int = 0
    missing: int = 0
    duplicates: int = 0
    mismatched: int = 0
    retry_out: str | None = None
    retry_rows: int = 0
    missing_chunks: list[str] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=lambda: {"missing": [], "duplicates": [], "errors": []})
    #: Prompt, cached and generated tokens of the lines written.
    tokens: TokenCounts = field(default_factory=TokenCounts)
    #: The realised $ per million tokens (token_cost.py), when collect was given the price table.
    cost_per_m_tokens: dict[str, dict[str, Any]] | None = None
    #: A table output (collect_sinks.py): the commit that appended the rows, or why none did.
    table_commit: str | None = None
    #: Rows answered from earlier runs (--reuse-from): in rows_total and rows_written, not in tokens.
    reused: int = 0
    #: The reused rows' tokens, what running them again would have cost, and its $ at the source runs' prices.
    tokens_saved: TokenCounts = field(default_factory=TokenCounts)
    usd_saved: float | None = None
    #: The worker time the reused rows took their source runs (their engine seconds per generated token).
    engine_s_saved: float | None = None
    #: A cascade: per model, rows it answered and rows of those it escalated (cascade_run.py).
    cascade: dict[str, dict[str, int]] | None = None
    #: A sweep: each arm's rows, errors, tokens and $ (runview/arms.py), when collect was given the price table.
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: A sweep: each arm's parse errors, tokens and $ per row, agreement with the first arm (comparison.py).
    comparison: dict[str, Any] | None = None
    #: Files and folders killed collects left (temp dir, beside the output), removed as this one started.
    leftovers_removed: list[Removed] = field(default_factory=list)

    @property
    def rows_run(self) -> int:
        """Rows answered by this run's engines (or set aside): every row but the reused ones."""
        return self.rows_total - self.reused

    @property
    def complete(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.mismatched == 0

    @property
    def error_rate(self) -> float:
        """Error lines (set-aside rows included) over every input row."""
        return self.errors / self.rows_total if self.rows_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "complete": self.complete,
            "error_rate": round(self.error_rate, 6),
            "rows_run": self.rows_run,
        }

    def note(self, kind: str, custom_id: str | None) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(str(custom_id))

"""The worker's live rates: what the heartbeat publishes and `orch status` sums."""

from __future__ import annotations

import time

from worker.totals import Totals


def _answered(totals: Totals, rows: int, tokens: int, busy_s: float) -> None:
    totals.requests += rows
    totals.tokens_out += tokens
    totals.busy_s += busy_s


def test_the_summary_line_counts_prompt_cached_and_generated_tokens():
    from orchestrator.core.exits import WorkerStatus
    from orchestrator.core.lines import BatchOutputLine
    from worker.wire import RowResult

    totals = Totals()
    line = BatchOutputLine(custom_id="x")
    totals.add([RowResult(0, "a", line, 300, 8, False, tokens_cached=256), RowResult(1, "b", line, 40, 8, False)])
    summary = totals.summary(2.0, WorkerStatus.SUCCESS)
    assert (summary["tokens_in"], summary["tokens_cached"], summary["tokens_out"]) == (340, 256, 16)


def test_both_rates_are_published_as_soon_as_a_row_is_answered():
    """A fast GPU answers its first rows within the engine's first second: the heartbeat then
    carries a row rate beside its token rate (status derives the ETA from it), not 0 rows/s."""
    totals = Totals()
    assert totals.rows_per_s() is None and totals.tokens_per_s() == 0.0
    _answered(totals, rows=3, tokens=96, busy_s=0.25)
    assert totals.rows_per_s() == 12.0 and totals.tokens_per_s() == 384.0


def test_a_rescue_trusts_the_row_rate_only_after_an_engine_second():
    totals = Totals()
    _answered(totals, rows=3, tokens=96, busy_s=0.25)
    assert totals.measured_rows_per_s() is None
    totals.busy_since = time.monotonic() - 1.0  # a pump under way counts
    assert 0 < totals.measured_rows_per_s() < 3 / 1.25


def test_totals_keep_the_figures_of_the_first_engine_batch_once():
    from orchestrator.core.lines import BatchOutputLine
    from worker.wire import RowResult

    totals = Totals(batch_rows=2)
    line = BatchOutputLine(custom_id="x")
    totals.busy_s = 3.0
    totals.add([RowResult(0, "a", line, 30, 8, False)])
    assert totals.first_batch is None  # one row of a two-row batch
    totals.add([RowResult(1, "b", line, 40, 8, False, tokens_cached=16)])
    assert totals.first_batch == [3.0, 0.0, 2, 70, 16, 16]
    totals.busy_s = 5.0
    totals.add([RowResult(2, "c", line, 40, 8, False)])
    assert totals.first_batch == [3.0, 0.0, 2, 70, 16, 16]  # kept from the first batch, not moved on

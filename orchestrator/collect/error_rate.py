"""The error-rate policy: how large a share of error rows `orch run` and `orch collect` accept.

Kept apart from collect.py, which imports the output line models: the CLI reads the default when
it builds its options, and `orch --help` must not pay for pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.core.errors import TooManyErrors

if TYPE_CHECKING:
    from orchestrator.collect.report import CollectReport

#: The share of error rows above which `orch run` and `orch collect` exit with TooManyErrors.
DEFAULT_MAX_ERROR_RATE = 0.1


def check_error_rate(report: CollectReport, max_rate: float) -> None:
    """TooManyErrors when more of the output's rows are errors than `max_rate` allows."""
    if report.errors and report.error_rate > max_rate:
        raise TooManyErrors(
            f"{report.errors:,} of {report.rows_total:,} rows are errors ({report.error_rate:.1%}, more than "
            f"--max-error-rate {max_rate:g}); the output was written to {report.out}",
            hint="look at the error lines' messages (`error.message`); a row set aside at prepare names its "
            "file:line. --max-error-rate 1.0 accepts any share",
        )

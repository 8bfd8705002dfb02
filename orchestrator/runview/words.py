"""How a status says things, the same in the terminal and on the page: durations, a worker's state and activity."""

from __future__ import annotations

from orchestrator.runview.sections import WorkerView


def duration(seconds: float | None, exact: bool = False) -> str:
    """How a status says a duration (the terminal's and the web page's): 45s, 12m, 3h05m; `exact` keeps
    the seconds under two hours (`2m10s`: a wait that moves)."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120 and not (exact and seconds >= 60):
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s" if exact else f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def duration_band(p10: float, p50: float, p90: float) -> str:
    """A forecast's duration band, `p50 (p10-p90)`, to the second under two hours: rounded to
    minutes, a band of 2m10s-2m50s reads 2m-2m."""
    return f"{duration(p50, exact=True)} ({duration(p10, exact=True)}-{duration(p90, exact=True)})"


def state_words(w: WorkerView) -> str:
    """A worker's job state with its recoveries: `RECOVERING (recovered 2x, spurious)`."""
    notes = [f"recovered {w.recovery_count}x"] if w.recovery_count else []
    notes += [str(w.recovery)] if w.recovery is not None else []
    return w.state_word + (f" ({', '.join(notes)})" if notes else "")


def doing(w: WorkerView) -> str:
    """A worker's activity, with how long where that is known: `loading 2m10s`."""
    return str(w.activity) + (f" {duration(w.activity_s, exact=True)}" if w.activity_s is not None else "")


def recovery_line(w: WorkerView) -> str | None:
    """What a worker's recovery was, with the evidence (None: no verdict)."""
    if w.recovery is None:
        return None
    beat = f"; last heartbeat {duration(w.heartbeat_age_s, exact=True)} ago" if w.heartbeat_age_s is not None else ""
    return f"worker {w.worker}: {w.recovery} recovery: {w.recovery.meaning}{beat}"

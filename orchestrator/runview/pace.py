"""A run's pace as its user lived it, from the finished chunks' times: the overall rate, the
chunks-done timeline and the run time (the status's `overall`, `timeline` and `run_time_s`).

Run time leaves out the time a run sat cancelled: from `orch cancel` to the launch that resumed it
(JobsRecord.pauses), and from a cancel not resumed yet to now."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.records import ChunkStats, JobsRecord
from orchestrator.runview.sections import Pace

#: The most points `timeline` keeps (a chart's worth, whatever the number of chunks).
TIMELINE_POINTS = 200


def overall_pace(finished: Sequence[tuple[float, ChunkStats]], jobs: JobsRecord) -> Pace | None:
    """The run's pace as its user lived it: from the first launch (workers start, load the model)
    to the last chunk's end. Workers started by hand leave no launch: then from the first chunk's start."""
    if not finished:
        return None
    launches = [a.launched_at for w in jobs.workers.values() for a in w.attempts]
    began = min([at - s.seconds for at, s in finished] + launches)
    ended = max(at for at, _ in finished)
    wall = max(ended - began - paused_s(jobs, began, ended), 1e-3)
    return Pace(
        wall_s=round(wall, 1),
        rows_per_s=round(sum(s.rows for _, s in finished) / wall, 3),
        tokens_per_s=round(sum(s.tokens_out for _, s in finished) / wall, 1),
    )


def first_launch(jobs: JobsRecord) -> float | None:
    """When the run's first worker was launched (None: never launched by orch)."""
    return min((a.launched_at for w in jobs.workers.values() for a in w.attempts), default=None)


def timeline(finished_at: Sequence[float], jobs: JobsRecord) -> list[list[float]]:
    """Chunks done over time: 0 at the first launch, then finished chunks' times, thinned to about
    TIMELINE_POINTS evenly spaced by count (the latest finish always kept)."""
    first = first_launch(jobs)
    points = [[round(first, 1), 0.0]] if first is not None and (not finished_at or first <= finished_at[0]) else []
    n = len(finished_at)
    step = max(n / TIMELINE_POINTS, 1.0)
    picks = sorted({int(i * step) for i in range(TIMELINE_POINTS) if int(i * step) < n} | ({n - 1} if n else set()))
    return points + [[round(finished_at[i], 1), float(i + 1)] for i in picks]


def paused_s(jobs: JobsRecord, began: float, ended: float) -> float:
    """Seconds between `began` and `ended` the run sat cancelled (a cancel not resumed: until `ended`)."""
    pauses = [*jobs.pauses, *([(jobs.cancelled_at, ended)] if jobs.cancelled_at is not None else [])]
    return sum(max(min(to, ended) - max(since, began), 0.0) for since, to in pauses)


def run_time_s(jobs: JobsRecord, *, now: float, finished_at: float | None) -> float | None:
    """How long the run has run: from its first launch to now (to its last chunk's end once
    complete, `finished_at`), less the time it sat cancelled. None before any launch."""
    launches = [a.launched_at for w in jobs.workers.values() for a in w.attempts]
    if not launches:
        return None
    began = min(launches)
    ended = max(finished_at if finished_at is not None else now, began)
    return round(max(ended - began - paused_s(jobs, began, ended), 0.0), 1)

"""A run of several models, model by model: chunks, rows, tokens, workers, $ and $ per million tokens.

What `orch status` (and --json, the web page, /metrics with a `model` label) shows per model: each
model's chunks (ManifestEntry.model), its finished chunks' tokens, and the cost of its pool's
workers (WorkerAssignment.model), so that models of different sizes on different GPUs can be
compared by what their answers cost. Empty for a run of one model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from orchestrator.core.records import ChunkStats, JobsRecord, ManifestEntry, PlanRecord
from orchestrator.core.worker_ids import job_worker
from orchestrator.runview.sections import Chunks, ModelRows, ModelView
from orchestrator.runview.tokens import per_million, tokens_of


class _Worker(Protocol):
    @property
    def worker(self) -> str: ...


W = TypeVar("W", bound=_Worker)


class _Facts(Protocol):
    """What the status gathered (runview/facts.RunFacts) that this needs."""

    @property
    def manifest(self) -> Sequence[ManifestEntry]: ...
    @property
    def plan(self) -> PlanRecord | None: ...
    @property
    def stats(self) -> Mapping[str, tuple[float, ChunkStats]]: ...
    @property
    def jobs(self) -> JobsRecord: ...


def models_status(
    facts: _Facts, done: set[str], workers: Sequence[W], cost_of: Callable[[W], float]
) -> dict[str, ModelView]:
    """Each model's chunks, rows, tokens, workers and cost, in the manifest's order."""
    manifest, plan, stats = facts.manifest, facts.plan, facts.stats
    models = list(dict.fromkeys(e.model for e in manifest if e.model))
    if not models:
        return {}
    # Workers outside the plan (the deadline policy's on-demand ones) count for the pool they were launched for.
    pool: dict[str, str | None] = {k: a.pool for k, w in facts.jobs.workers.items() for a in w.attempts if a.pool}
    pool |= {str(a.worker): a.model for a in plan.workers} if plan is not None else {}
    out: dict[str, ModelView] = {}
    for model in models:
        entries = [e for e in manifest if e.model == model]
        finished = [e for e in entries if e.chunk in done]
        tokens = tokens_of(stats[e.chunk][1] for e in finished if e.chunk in stats)
        views = [v for v in workers if pool.get(job_worker(v.worker)) == model]
        usd = sum(cost_of(v) for v in views)
        bought = per_million(usd, tokens)
        out[model] = ModelView(
            chunks=Chunks(total=len(entries), done=len(finished)),
            rows=ModelRows(
                total=sum(e.rows for e in entries),
                done=sum(e.rows for e in finished),
                errors=sum(stats[e.chunk][1].errors for e in finished if e.chunk in stats),
            ),
            tokens=tokens.section(),
            workers=len(views),
            usd=round(usd, 4),
            usd_per_m_tokens=bought.usd_per_m_tokens,
        )
    return out

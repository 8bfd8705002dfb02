"""How a simulated fleet works: its plan, whether it steals and rescues, whether it checkpoints inside chunks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.core.protocol.claims import RescuePolicy
from orchestrator.core.records import ManifestEntry, PlanRecord, WorkerAssignment
from orchestrator.planning.plan import contiguous_split, plan_chunks


@dataclass(frozen=True)
class Policy:
    """How a fleet works: its plan, whether it steals and rescues, whether it checkpoints inside chunks."""

    name: str
    plan: Callable[[Sequence[ManifestEntry], int], PlanRecord]
    steal: bool
    rescue: RescuePolicy | None
    checkpoints: bool
    #: Prepared with --group-by-prefix and rows fed by prefix: a chunk's rows of one prefix share its
    #: prefill. Otherwise rows come in input order: a row hits the cache only if its prefix is held.
    prefix_aware: bool = False


def _static_plan(entries: Sequence[ManifestEntry], workers: int) -> PlanRecord:
    lists = contiguous_split([e.chunk for e in entries], workers)
    by_id = {e.chunk: e for e in entries}
    return PlanRecord(
        workers=[
            WorkerAssignment(
                worker=w, chunks=c, rows=sum(by_id[x].rows for x in c), est_tokens=sum(by_id[x].est_tokens for x in c)
            )
            for w, c in enumerate(lists)
        ],
        chunks=len(entries),
        rows=sum(e.rows for e in entries),
        est_tokens=sum(e.est_tokens for e in entries),
        created_at=0.0,
    )


#: orch: balanced plan, row-level checkpoints, stealing, lease takeover, rescue of slow chunks.
ORCH = Policy("orch", plan_chunks, steal=True, rescue=RescuePolicy(), checkpoints=True, prefix_aware=True)
#: The SkyPilot example: static contiguous lists (without its chunk-dropping bug), a success marker
#: per chunk and nothing inside one, a preempted worker resumes its own list after restart.
SKYPILOT_EXAMPLE = Policy("skypilot-example", _static_plan, steal=False, rescue=None, checkpoints=False)
POLICIES = {p.name: p for p in (ORCH, SKYPILOT_EXAMPLE)}

"""The plan: every chunk to exactly one worker, balanced by estimated work, deterministic; and what is still needed.

Balancing is greedy longest-processing-time: chunks from the heaviest down, each to the worker
with the least work so far (a heap). It is within 4/3 of the best possible makespan in theory and
within a fraction of a percent in practice when chunks are many and of varied size. Each list is
then sorted by chunk id, the shape of the SkyPilot example's workers/<i>.txt.

Chunks prepared with `--group-by-prefix` come in prompt-prefix order (a prefix's rows fill
consecutive chunks). Their plan is prefix-affine: contiguous runs of chunks cut where the running
work estimate crosses each worker's share, so a prefix's chunks go to one worker, or two where a
cut falls inside it, and loads are within half a chunk of even. Each worker's engine then keeps a
few prefixes cached instead of every prefix of the run.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence

from orchestrator.core.context import RunContext
from orchestrator.core.layout import RunLayout
from orchestrator.core.pools import pool_workers
from orchestrator.core.protocol.snapshot import list_done
from orchestrator.core.records import ManifestEntry, PlanRecord, WorkerAssignment, read_manifest, read_plan
from orchestrator.core.store import Store


def plan_chunks(entries: Sequence[ManifestEntry], workers: int) -> PlanRecord:
    if workers < 1:
        raise ValueError("at least one worker")
    if any(e.edge_prefixes for e in entries):
        lists = _prefix_affine(entries, workers)
    else:
        lists = _longest_first(entries, workers)
    loads = [sum(e.est_tokens for e in chosen) for chosen in lists]
    assignments = []
    for w, chosen in enumerate(lists):
        chosen.sort(key=lambda e: e.chunk)
        assignments.append(
            WorkerAssignment(
                worker=w, chunks=[e.chunk for e in chosen], rows=sum(e.rows for e in chosen), est_tokens=loads[w]
            )
        )
    return PlanRecord(
        workers=assignments,
        chunks=len(entries),
        rows=sum(e.rows for e in entries),
        est_tokens=sum(e.est_tokens for e in entries),
        created_at=time.time(),
    )


def plan_pools(entries: Sequence[ManifestEntry], counts: Mapping[str, int]) -> PlanRecord:
    """A run of several models: each model's chunks planned over its own workers (`counts`, in
    order), numbered one after the other; each assignment names its model (the worker's pool)."""
    assignments: list[WorkerAssignment] = []
    for model, count in counts.items():
        pool = plan_chunks([e for e in entries if e.model == model], count)
        for a in pool.workers:
            assignments.append(a.model_copy(update={"worker": len(assignments), "model": model}))
    return PlanRecord(
        workers=assignments,
        chunks=len(entries),
        rows=sum(e.rows for e in entries),
        est_tokens=sum(e.est_tokens for e in entries),
        created_at=time.time(),
    )


def make_plan(ctx: RunContext, manifest: Sequence[ManifestEntry], workers: int) -> PlanRecord:
    """The run's plan over `workers`: per model pool for a run of several models."""
    counts = pool_counts(ctx, manifest, workers)
    return plan_chunks(manifest, workers) if counts is None else plan_pools(manifest, counts)


def pool_counts(ctx: RunContext, entries: Sequence[ManifestEntry], workers: int) -> dict[str, int] | None:
    """Workers per model for a run of several models (None for one model): core/pools.pool_workers."""
    if not ctx.spec.models:
        return None
    rows: dict[str, int] = {}
    for e in entries:
        rows[e.model or ""] = rows.get(e.model or "", 0) + e.rows
    return pool_workers(ctx.spec, rows, workers)


def _longest_first(entries: Sequence[ManifestEntry], workers: int) -> list[list[ManifestEntry]]:
    heap = [(0, w) for w in range(workers)]  # (est tokens so far, worker): ties go to the lower worker
    lists: list[list[ManifestEntry]] = [[] for _ in range(workers)]
    for entry in sorted(entries, key=lambda e: (-e.est_tokens, e.chunk)):
        load, w = heapq.heappop(heap)
        lists[w].append(entry)
        heapq.heappush(heap, (load + entry.est_tokens, w))
    return lists


def _prefix_affine(entries: Sequence[ManifestEntry], workers: int) -> list[list[ManifestEntry]]:
    """Chunks in prefix order, cut into `workers` contiguous runs of about equal work: a chunk
    goes to the worker whose share holds the middle of its work."""
    total = sum(e.est_tokens for e in entries) or 1
    lists: list[list[ManifestEntry]] = [[] for _ in range(workers)]
    done = 0
    for entry in sorted(entries, key=lambda e: e.chunk):
        middle = done + entry.est_tokens / 2
        lists[min(workers - 1, int(middle * workers / total))].append(entry)
        done += entry.est_tokens
    return lists


def skypilot_example_split(chunks: Sequence[str], workers: int) -> list[list[str]]:
    """The SkyPilot example's get_per_worker_chunk_paths, for comparison only: contiguous slices of
    len(chunks) // workers, which drops the remainder (8 of 200 chunks for 16 workers)."""
    per = len(chunks) // workers
    return [list(chunks[i * per : (i + 1) * per]) for i in range(workers)]


def contiguous_split(chunks: Sequence[str], workers: int) -> list[list[str]]:
    """Static contiguous slices that keep every chunk (the example's idea without its bug)."""
    return [list(chunks[len(chunks) * i // workers : len(chunks) * (i + 1) // workers]) for i in range(workers)]


def write_plan(store: Store, layout: RunLayout, plan: PlanRecord) -> None:
    """workers/<i>.txt (chunk paths, the SkyPilot example's shape) for every worker, then plan.json.
    Lists of workers beyond the new count are removed."""
    for a in plan.workers:
        store.put(layout.worker_list(str(a.worker)), "".join(f"{layout.chunk_path(c)}\n" for c in a.chunks).encode())
    keep = {layout.worker_list(str(a.worker)) for a in plan.workers}
    for info in store.list(f"{layout.root}workers/"):
        if info.key not in keep:
            store.delete(info.key)
    store.put(layout.plan, plan.to_bytes())


def ensure_plan(
    ctx: RunContext, workers: int, echo: Callable[[str], None] = lambda _line: None, *, write: bool = True
) -> PlanRecord:
    """The run's plan, made (or remade) when there is none or it was made for another worker count.
    With `write=False` (a dry run) a new plan is only made, not recorded."""
    plan = read_plan(ctx.store, ctx.layout)
    if plan is not None and not ctx.spec.models and len(plan.workers) == workers:
        return plan  # one model: the plan fits without reading the manifest
    manifest = read_manifest(ctx.store, ctx.layout)
    counts = pool_counts(ctx, manifest, workers)
    if plan is not None and counts is not None and _pools_fit(plan, counts):
        return plan
    plan = make_plan(ctx, manifest, workers)
    if write:
        write_plan(ctx.store, ctx.layout, plan)
    pools = "" if counts is None else " (" + ", ".join(f"{m}: {n}" for m, n in counts.items()) + ")"
    echo(
        f"planned {plan.chunks} chunks over {len(plan.workers)} workers{pools}"
        + ("" if write else " (not recorded: dry run)")
    )
    return plan


def _pools_fit(plan: PlanRecord, counts: Mapping[str, int]) -> bool:
    made: dict[str, int] = {}
    for a in plan.workers:
        made[a.model or ""] = made.get(a.model or "", 0) + 1
    return made == dict(counts)


def run_plan(ctx: RunContext) -> PlanRecord:
    """The run's recorded plan, made over the spec's workers when there is none."""
    return read_plan(ctx.store, ctx.layout) or ensure_plan(ctx, ctx.spec.workers.count)


def workers_needed(ctx: RunContext, plan: PlanRecord | None = None) -> tuple[list[int], list[str]]:
    """(workers to launch, unfinished chunks) of `plan`, the run's own when not given. Workers whose
    own lists hold unfinished chunks come first; if the unfinished chunks are fewer than the
    workers, fewer workers are enough (the others' leftovers are stolen)."""
    plan = plan or run_plan(ctx)
    done = list_done(ctx.store, ctx.layout)
    remaining = [c for a in plan.workers for c in a.chunks if c not in done]
    # Per pool (a run of several models): a worker can only take its own model's chunks.
    needed: list[int] = []
    for model in dict.fromkeys(a.model for a in plan.workers):
        pool = [a for a in plan.workers if a.model == model]
        left = sum(1 for a in pool for c in a.chunks if c not in done)
        with_work = [a.worker for a in pool if any(c not in done for c in a.chunks)]
        needed += with_work[: min(len(with_work), left)]
    return needed, remaining

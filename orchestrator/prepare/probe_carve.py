"""A probe's rows: a stratified sample of the run's rows, carved out of their chunks into one chunk of its own.

The probe answers real rows of the run once, through the ordinary protocol: the sampled rows are
moved (before any worker started) into a new chunk whose positions file says where each belongs
in the input, and taken out of the chunks they came from (those get positions files too). The
probe worker claims that chunk with a lease and writes its done marker like any other; the run's
workers skip it as done, and collect places its rows by their positions. Nothing is written twice.

The sample is stratified (sampling.py: prompt length, output budget, prefix group), at least one
full engine batch (planning/probe_work.engine_batch), drawn with a seed from the run's name so a
retry picks the same rows.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.layout import chunk_id
from orchestrator.core.records import ManifestEntry, PlanRecord, PrepareError, read_manifest
from orchestrator.core.records.base import iter_jsonl, read_record
from orchestrator.core.records.run import PrepareRecord
from orchestrator.core.store import NotFound
from orchestrator.prepare.sampling import lone_prefixes_merged, row_max_tokens, stratified_sample, stratum_of
from orchestrator.prepare.writers import write_manifest


@dataclass(frozen=True)
class SampledRow:
    """One row of the run as the sampler sees it."""

    chunk: str
    row: int  # in its chunk
    position: int  # in the whole input
    line: bytes
    max_tokens: int
    stratum: str


def run_rows(ctx: RunContext, entries: Sequence[ManifestEntry]) -> list[SampledRow]:
    """Every row of the run with its input position (rows set aside at prepare skipped, as collect does)."""
    aside = _set_aside_positions(ctx)
    rows: list[SampledRow] = []
    for entry in entries:
        lines = [x for x in ctx.store.get(ctx.layout.chunk(entry.chunk)).data.splitlines() if x.strip()]
        if entry.positions:
            positions = [int(p) for p in ctx.store.get(ctx.layout.root + entry.positions).data.split()]
        else:
            positions, at = [], entry.first or 0
            for _ in lines:
                while at in aside:
                    at += 1
                positions.append(at)
                at += 1
        for i, (line, position) in enumerate(zip(lines, positions, strict=True)):
            m = row_max_tokens(line, ctx.spec.sampling.max_tokens)
            rows.append(SampledRow(entry.chunk, i, position, line, m, stratum_of(line, m)))
    strata = lone_prefixes_merged([r.stratum for r in rows])
    return [replace(r, stratum=s) for r, s in zip(rows, strata, strict=True)]


def _set_aside_positions(ctx: RunContext) -> set[int]:
    try:
        data = ctx.store.get(ctx.layout.prepare_errors).data
    except NotFound:
        return set()
    return {
        e.position
        for e in iter_jsonl(PrepareError, data.splitlines(), ctx.layout.prepare_errors)
        if e.position is not None
    }


def probe_room(rows: int) -> int:
    """The most rows a probe takes of `rows`: a quarter (none of fewer than four)."""
    return rows // 4


def sample_rows(rows: Sequence[SampledRow], share: float, min_rows: int, seed: str) -> list[SampledRow]:
    """A stratified sample: max(min_rows, share of the rows), never more than probe_room of them, in input order."""
    want = min(max(min_rows, math.ceil(share * len(rows))), probe_room(len(rows)))
    return stratified_sample(rows, want, seed)


def refuse_if_started(ctx: RunContext) -> None:
    for prefix, what in ((ctx.layout.leases_prefix, "leases"), (ctx.layout.done_prefix, "done markers")):
        if next(iter(ctx.store.list(prefix)), None) is not None:
            raise OrchError(
                f"run {ctx.layout.run!r} has started ({what} under {prefix}): "
                "a probe now would move rows workers may hold",
                hint=f"`orch estimate --run {ctx.layout.run}` forecasts from what its finished chunks measured",
            )


def carve_probe_chunk(ctx: RunContext, picked: Sequence[SampledRow], model: str | None = None) -> ManifestEntry:
    """Move `picked` (rows of one model pool, `model` in a run of several) into a new chunk appended
    to the manifest; the chunks they left get positions files. Written chunk files first, the
    manifest last: until it is written the run reads as before."""
    entries = read_manifest(ctx.store, ctx.layout)
    by_chunk: dict[str, set[int]] = defaultdict(set)
    for r in picked:
        by_chunk[r.chunk].add(r.row)
    all_rows = run_rows(ctx, [e for e in entries if e.chunk in by_chunk])
    kept: dict[str, list[SampledRow]] = defaultdict(list)
    for r in all_rows:
        if r.row not in by_chunk[r.chunk]:
            kept[r.chunk].append(r)
    new_entries = [_rewrite(ctx, e, kept[e.chunk]) if e.chunk in by_chunk else e for e in entries]
    probe = _write_chunk(ctx, chunk_id(len(entries), len(entries) + 1), list(picked), None, model)
    new_entries.append(probe)
    write_manifest(ctx, new_entries)
    found = read_record(ctx.store, ctx.layout.prepare_record, PrepareRecord)
    if found is not None:
        ctx.store.put(ctx.layout.prepare_record, found[0].model_copy(update={"chunks": len(new_entries)}).to_bytes())
    return probe


def _rewrite(ctx: RunContext, entry: ManifestEntry, rows: list[SampledRow]) -> ManifestEntry:
    return _write_chunk(ctx, entry.chunk, rows, entry)


def _write_chunk(
    ctx: RunContext, chunk: str, rows: list[SampledRow], old: ManifestEntry | None, model: str | None = None
) -> ManifestEntry:
    data = b"".join(r.line + b"\n" for r in rows)
    positions = "".join(f"{r.position}\n" for r in rows).encode()
    ctx.store.put(ctx.layout.chunk(chunk), data)
    ctx.store.put(ctx.layout.chunk_positions(chunk), positions)
    update = {
        "chunk": chunk,
        "key": ctx.layout.chunk_path(chunk),
        "rows": len(rows),
        "bytes": len(data),
        "est_prompt_tokens": len(data) // 4,
        "max_output_tokens": sum(r.max_tokens for r in rows),
        "positions": ctx.layout.chunk_positions(chunk).removeprefix(ctx.layout.root),
        "positions_sha256": hashlib.sha256(positions).hexdigest(),
    }
    if old is not None:
        return old.model_copy(update=update)
    return ManifestEntry.model_validate({**update, "model": model})


def probe_first_plan(plan: PlanRecord, probes: Sequence[tuple[str, str | None]]) -> PlanRecord:
    """The plan with each probe chunk (chunk, its model pool) first on the list of a worker of its
    pool, one probe a worker: that worker, launched for one chunk, claims it."""
    chunks = {chunk for chunk, _ in probes}
    workers = [a.model_copy(update={"chunks": [c for c in a.chunks if c not in chunks]}) for a in plan.workers]
    taken: set[int] = set()
    for chunk, model in probes:
        i = next(i for i, a in enumerate(workers) if a.model == model and i not in taken)
        taken.add(i)
        workers[i] = workers[i].model_copy(update={"chunks": [chunk, *workers[i].chunks]})
    return plan.model_copy(update={"workers": workers})


def probe_workers(plan: PlanRecord, probes: Sequence[str]) -> dict[str, int]:
    """Probe chunk -> the worker whose list it heads (probe_first_plan's)."""
    heads = {a.chunks[0]: a.worker for a in plan.workers if a.chunks}
    return {chunk: heads[chunk] for chunk in probes if chunk in heads}

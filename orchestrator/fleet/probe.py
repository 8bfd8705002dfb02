"""`orch estimate --probe`: run a stratified sample of the run's rows through a real worker, and keep what it measured.

1. Sample and carve (prepare/probe_carve.py): the rows move into a probe chunk, first on a
   worker's list; nothing else changes for the run. On SkyPilot with several candidate GPUs, one
   probe chunk per candidate, each a sample of its own (disjoint rows), on its own worker's list.
2. Launch that worker through the run's backend with ORCH_MAX_CHUNKS=1 (on SkyPilot pinned to its
   candidate GPU, spot): it claims the probe chunk by the ordinary lease, answers it, writes its
   done marker and exits. Its rows are the run's. A candidate's probe is cancelled once its spot
   price times the time since its launch spends its share of `--probe-budget`; its chunk is left
   to the run's workers (nothing is lost), and that candidate is forecast from the table.
3. Measure: per row, from the marker's parts (prompt, cached and generated tokens, whether it
   stopped at max_tokens); the engine and load seconds from the worker's last heartbeat.
A probe already made is reused; one whose worker died is launched again (its chunk resumes).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from orchestrator.backends.base import Launcher
from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.layout import RunLayout
from orchestrator.core.pools import run_models
from orchestrator.core.prefix import feed_order
from orchestrator.core.probe_limits import PROBE_BUDGET_USD
from orchestrator.core.protocol.heartbeats import newest_heartbeat_of
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import ManifestEntry, read_manifest, read_marker
from orchestrator.core.records.forecast import ProbeRecord, RowSample, StratumCount, read_probes
from orchestrator.fleet.probe_launch import Stop, launch_and_wait, on, target_name
from orchestrator.planning.forecast import on_cpus
from orchestrator.planning.probe_work import STATIC_BATCH_ENGINES, engine_batch, probe_size
from orchestrator.prepare.probe_carve import (
    SampledRow,
    carve_probe_chunk,
    probe_first_plan,
    probe_room,
    refuse_if_started,
    run_rows,
    sample_rows,
)


def probe_candidates(ctx: RunContext) -> list[str | None]:
    """The accelerators probed, each on its own: on SkyPilot every GPU type the spec names; else
    (this machine, or a cluster of CPUs) the one its workers run on (None)."""
    return [None] if on_cpus(ctx) else list(ctx.spec.resources.gpus)


def pool_rows(ctx: RunContext) -> dict[str | None, int]:
    """Each model pool's rows (None: a run of one model), probe chunks counted with their pool."""
    rows: dict[str | None, int] = {}
    for e in read_manifest(ctx.store, ctx.layout):
        pool = e.model if ctx.spec.models else None
        rows[pool] = rows.get(pool, 0) + e.rows
    return rows


def probes_held(rows: int, candidates: int) -> int:
    """How many of `candidates` probes `rows` hold, each taking at most probe_room of the rows the
    ones before it left: the rest are forecast from the table."""
    held = 0
    while held < candidates and probe_room(rows):
        rows -= probe_room(rows)
        held += 1
    return held


def probe_plan(ctx: RunContext) -> tuple[list[tuple[str | None, str | None]], list[tuple[str | None, str | None, int]]]:
    """(targets, left out): the (model pool, accelerator) of each probe, and each (pool, accelerator,
    pool's rows) whose pool has too few rows to probe it. A pool's candidates are its own
    (`resources`), as its workers would run; a run of one model is the pool None."""
    targets: list[tuple[str | None, str | None]] = []
    left: list[tuple[str | None, str | None, int]] = []
    rows = pool_rows(ctx)
    for pool in run_models(ctx.spec) if ctx.spec.models else [None]:
        if not rows.get(pool):
            continue
        candidates = probe_candidates(ctx.for_pool(pool) if pool else ctx)
        held = probes_held(rows[pool], len(candidates))
        targets += [(pool, gpu) for gpu in candidates[:held]]
        left += [(pool, gpu, rows[pool]) for gpu in candidates[held:]]
    return targets, left


def _probe_key(layout: RunLayout, probe: ProbeRecord, first: bool) -> str:
    if first or (probe.gpu is None and probe.model is None):
        return layout.probe
    return layout.probe_of(re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(x for x in (probe.model, probe.gpu) if x)))


def run_probes(
    ctx: RunContext,
    share: float,
    *,
    min_rows: int | None = None,
    budget_usd: float = PROBE_BUDGET_USD,
    timeout_s: float = 3600.0,
    echo: Callable[[str], None] = lambda _l: None,
    launcher: Launcher | None = None,
) -> list[ProbeRecord]:
    """The run's probes, one per candidate accelerator (of each model pool, in a run of several):
    made and run now, or those made before (launched again if they never finished, unless their
    budget was spent). At least one measured."""
    probes, (targets, left) = read_probes(ctx.store, ctx.layout), probe_plan(ctx)
    if not targets:
        counts = ", ".join(dict.fromkeys(f"{n} of model {pool!r}" if pool else str(n) for pool, _, n in left))
        raise OrchError(
            f"run {ctx.layout.run!r} has too few rows to probe ({counts or 0}; a probe takes at most a quarter)",
            hint="run it: `orch run` measures as it goes",
        )
    for pool, gpu, n in left:
        echo(f"probe{target_name(pool, gpu)}: too few rows ({n}) to probe: forecast from the table")
    carved = len(probes) >= len(targets)
    if probes and carved and all(p.busy_s is not None or p.stopped for p in probes):
        for p in probes:
            echo(f"probe{on(p)}: {p.rows} rows {'measured before' if p.stopped is None else p.stopped} ({p.chunk})")
        return probes
    if not carved:
        probes = _carve(ctx, targets, share, min_rows, probes, echo)
    todo = {p.chunk for p in probes if p.busy_s is None and not p.stopped}
    unfinished = [p for p in probes if p.chunk in todo and read_marker(ctx.store, ctx.layout, p.chunk) is None]
    stopped = _launch(ctx, probes, unfinished, budget_usd, timeout_s, echo, launcher) if unfinished else {}
    for i, p in enumerate(probes):
        if p.chunk in todo and p.chunk not in stopped:
            probes[i] = _measure(ctx.for_pool(p.model), p)
        elif p.chunk in stopped and stopped[p.chunk].budget:
            probes[i] = p.model_copy(update={"stopped": stopped[p.chunk].reason})
        ctx.store.put(_probe_key(ctx.layout, probes[i], i == 0), probes[i].to_bytes())
    if not any(p.busy_s is not None for p in probes):
        first = next(iter(stopped.values()))
        raise OrchError(first.reason, hint=first.hint)
    for p in probes:
        if p.chunk in stopped:
            echo(f"probe{on(p)}: {stopped[p.chunk].reason}: forecast from the table; its rows are left to the run")
    return probes


def _launch(
    ctx: RunContext,
    probes: list[ProbeRecord],
    unfinished: list[ProbeRecord],
    budget_usd: float,
    timeout_s: float,
    echo: Callable[[str], None],
    launcher: Launcher | None,
) -> dict[str, Stop]:
    """launch_and_wait through the run's backend, each worker's job kept in its probe record the
    moment it is launched (in `probes` and the store): an estimate interrupted later names it, and
    the next one waits on it instead of launching another."""
    from orchestrator.backends import backend_for

    def launched(probe: ProbeRecord, job: str) -> None:
        i = probes.index(probe)
        probes[i] = probe.model_copy(update={"job": job, "launched_at": time.time()})
        ctx.store.put(_probe_key(ctx.layout, probes[i], i == 0), probes[i].to_bytes())

    return launch_and_wait(ctx, probes, unfinished, budget_usd, timeout_s, echo, launcher or backend_for(ctx), launched)


def _carve(
    ctx: RunContext,
    targets: list[tuple[str | None, str | None]],
    share: float,
    min_rows: int | None,
    made: list[ProbeRecord],
    echo: Callable[[str], None],
) -> list[ProbeRecord]:
    """A probe chunk for each target (probe_plan's) without one: a sample of its pool's rows outside
    the probe chunks already carved, of `share` of the pool's rows (planning/probe_work.probe_size:
    at least `min_rows`, else two of its engine's batches within 1.5% of the rows). Each record is
    written once its chunk is, so an interrupted estimate carves only what it had not; then the
    plan, each chunk first on the list of a worker of its pool."""
    refuse_if_started(ctx)
    probes = list(made)
    counted: dict[str | None, tuple[int, dict[str, StratumCount]]] = {}
    for model, gpu in targets[len(probes) :]:
        if model not in counted:
            counted[model] = _strata(run_rows(ctx, _pool_entries(read_manifest(ctx.store, ctx.layout), model)))
        total, strata = counted[model]
        batch = engine_batch(ctx.for_pool(model))
        want = probe_size(total, share, min_rows, batch)
        # Each carve rewrites the chunks it took rows from: the rows are read again after one.
        taken = {p.chunk for p in probes}
        free = run_rows(
            ctx, [e for e in _pool_entries(read_manifest(ctx.store, ctx.layout), model) if e.chunk not in taken]
        )
        seed = "/".join(x for x in (ctx.layout.run, model, gpu) if x)
        picked = sample_rows(free, 0.0, want, seed=seed)
        assert picked, (model, gpu, total)  # probe_plan left out each target its pool's rows could not hold
        entry = carve_probe_chunk(ctx, picked, model)
        rank = {row: place for place, row in enumerate(feed_order([r.line for r in picked]))}
        probe = ProbeRecord(
            chunk=entry.chunk,
            gpu=gpu,
            model=model,
            rows=len(picked),
            share=len(picked) / total,
            strata=strata,
            created_at=time.time(),
            # The rows' strata, in the probe chunk's order, ride along until measured.
            samples=[
                RowSample(
                    stratum=r.stratum,
                    est_prompt_tokens=len(r.line) // 4,
                    prompt_tokens=0,
                    cached_tokens=0,
                    completion_tokens=0,
                    max_tokens=r.max_tokens,
                    hit_max=False,
                    feed_rank=rank[i],
                )
                for i, r in enumerate(picked)
            ],
        )
        ctx.store.put(_probe_key(ctx.layout, probe, not probes), probe.to_bytes())
        probes.append(probe)
        below = (
            f"; less than two engine batches ({2 * batch}): --probe-rows {2 * batch} measures a busier engine"
            if probe.rows < 2 * batch
            else ""
        )
        echo(
            f"probe{on(probe)}: {probe.rows} rows ({probe.share:.1%} of {total:,}) in {len(strata)} strata "
            f"carved into {probe.chunk}{below}"
        )
    _plan_probes(ctx, probes)
    return probes


def _pool_entries(entries: list[ManifestEntry], model: str | None) -> list[ManifestEntry]:
    return entries if model is None else [e for e in entries if e.model == model]


def _strata(rows: list[SampledRow]) -> tuple[int, dict[str, StratumCount]]:
    """(rows, each stratum's count): what a probe's sample stands for."""
    strata: dict[str, StratumCount] = {}
    for r in rows:
        s = strata.setdefault(r.stratum, StratumCount())
        s.rows += 1
        s.max_tokens += r.max_tokens
        s.est_prompt_tokens += len(r.line) // 4
    return len(rows), strata


def _plan_probes(ctx: RunContext, probes: list[ProbeRecord]) -> None:
    """The run's plan with each probe chunk first on a worker of its pool (a pool has at least as
    many workers as probes)."""
    from orchestrator.planning.plan import plan_chunks, plan_pools, pool_counts, write_plan

    manifest = read_manifest(ctx.store, ctx.layout)
    counts = pool_counts(ctx, manifest, ctx.spec.workers.count)
    if counts is None:
        plan = plan_chunks(manifest, max(ctx.spec.workers.count, len(probes)))
    else:
        plan = plan_pools(manifest, {m: max(n, sum(p.model == m for p in probes)) for m, n in counts.items()})
    write_plan(ctx.store, ctx.layout, probe_first_plan(plan, [(p.chunk, p.model) for p in probes]))


def _measure(ctx: RunContext, probe: ProbeRecord) -> ProbeRecord:
    marker = read_marker(ctx.store, ctx.layout, probe.chunk)
    if marker is None:  # launched above and waited for: only a store changed outside orch gets here
        raise OrchError(f"the probe chunk {probe.chunk} has no done marker", where=ctx.layout.done(probe.chunk))
    samples = list(probe.samples)
    for part in marker.parts:
        for line in iter_part_lines(ctx.store.get(part.key).data, marker.output_format):
            usage = line.usage()
            finish: Any = line.first_choice().get("finish_reason") if not line.failed else None
            samples[line.row] = samples[line.row].model_copy(
                update={
                    "prompt_tokens": usage.prompt_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "hit_max": finish == "length",
                }
            )
    beat = newest_heartbeat_of(ctx.store, ctx.layout, marker.holder)
    busy = beat.busy_s if beat is not None and beat.busy_s > 0 else marker.finished_at - marker.started_at
    threads = max(1, (os.cpu_count() or 1) // max(1, ctx.spec.workers.count)) if ctx.spec.backend == "local" else None
    return probe.model_copy(
        update={
            "samples": samples,
            "busy_s": round(busy, 3),
            "load_s": beat.load_s if beat is not None else None,
            "busy_cpu_s": beat.busy_cpu_s if beat is not None else None,
            "first_batch": beat.first_batch if beat is not None else None,
            "accelerator": marker.accelerator,
            "threads": threads,
            "engine_batch": engine_batch(ctx),
            "static_batches": ctx.spec.model.engine in STATIC_BATCH_ENGINES,
        }
    )


def probe_summary(probe: ProbeRecord) -> dict[str, Any]:
    """What the probe measured, in the figures a user reads (the `probe` block of `--json`)."""
    s = probe.samples
    out = sum(x.completion_tokens for x in s)
    uncached = sum(x.prompt_tokens - x.cached_tokens for x in s)
    prompt = sum(x.prompt_tokens for x in s)
    busy = probe.busy_s or 0.0
    summary: dict[str, Any] = json.loads(
        json.dumps(
            {
                "chunk": probe.chunk,
                "model": probe.model,
                "gpu": probe.gpu,
                "stopped": probe.stopped,
                "rows": probe.rows,
                "share": round(probe.share, 4),
                "strata": len(probe.strata),
                "accelerator": probe.accelerator,
                "engine_s": probe.busy_s,
                "load_s": probe.load_s,
                "engine_cpu_s": probe.busy_cpu_s,
                "decode_tokens_per_s": round(out / busy, 1) if busy else None,
                "prefill_tokens_per_s": round(uncached / busy, 1) if busy else None,
                "prefix_cache_hit": round(sum(x.cached_tokens for x in s) / prompt, 3) if prompt else 0.0,
                "hit_max_tokens": sum(x.hit_max for x in s),
                "output_tokens_mean": round(out / len(s), 1) if s else 0.0,
            }
        )
    )
    return summary

"""`orch estimate --probe`: run a stratified sample of the run's rows through a real worker, and keep what it measured.

1. Sample and carve (controller/probe_carve.py): the rows move into a probe chunk, first on worker
   0's list; nothing else changes for the run.
2. Launch worker 0 through the run's backend with ORCH_MAX_CHUNKS=1: it claims the probe chunk by
   the ordinary lease, answers it, writes its done marker and exits. Its rows are the run's.
3. Measure: per row, from the marker's parts (prompt, cached and generated tokens, whether it
   stopped at max_tokens); the engine and load seconds from the worker's last heartbeat.
A probe already made is reused; one whose worker died is launched again (its chunk resumes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from orchestrator.backends.base import Launcher
from orchestrator.controller.probe_carve import (
    carve_probe_chunk,
    engine_batch,
    probe_first_plan,
    refuse_if_started,
    run_rows,
    sample_rows,
)
from orchestrator.core.context import RunContext
from orchestrator.core.errors import OrchError
from orchestrator.core.protocol.heartbeats import newest_heartbeat_of
from orchestrator.core.protocol.parts import iter_part_lines
from orchestrator.core.records import read_manifest, read_marker
from orchestrator.core.records.base import read_record
from orchestrator.core.records.forecast import ProbeRecord, RowSample, StratumCount

#: How often the probe's chunk and job are looked at while it runs.
POLL_S = 1.0


def read_probe(ctx: RunContext) -> ProbeRecord | None:
    found = read_record(ctx.store, ctx.layout.probe, ProbeRecord)
    return found[0] if found is not None else None


def run_probe(
    ctx: RunContext,
    share: float,
    *,
    min_rows: int | None = None,
    timeout_s: float = 3600.0,
    echo: Callable[[str], None] = lambda _l: None,
) -> ProbeRecord:
    """The run's probe: made and run now, or the one made before (launched again if it never finished)."""
    if ctx.spec.models:
        # One probe chunk is one worker's: rows of several models in it would be answered by one model.
        raise OrchError(
            f"`orch estimate --probe` is not built for a run of several models ({', '.join(ctx.spec.models)})",
            hint="`orch plan` prints each model's pool estimated on its own machines; or probe each "
            "model as a run of its own",
            where="models",
        )
    probe = read_probe(ctx)
    if probe is not None and probe.busy_s is not None:
        echo(f"probe: {probe.rows} rows measured before ({probe.chunk}): reused")
        return probe
    if probe is None:
        probe = _carve(ctx, share, min_rows or 2 * engine_batch(ctx))
        echo(f"probe: {probe.rows} rows ({probe.share:.1%}) in {len(probe.strata)} strata carved into {probe.chunk}")
    if read_marker(ctx.store, ctx.layout, probe.chunk) is None:
        _launch_and_wait(ctx, probe, timeout_s, echo)
    probe = _measure(ctx, probe)
    ctx.store.put(ctx.layout.probe, probe.to_bytes())
    return probe


def _carve(ctx: RunContext, share: float, min_rows: int) -> ProbeRecord:
    from orchestrator.controller.plan import plan_chunks, write_plan

    refuse_if_started(ctx)
    manifest = read_manifest(ctx.store, ctx.layout)
    rows = run_rows(ctx, manifest)
    picked = sample_rows(rows, share, min_rows, seed=ctx.layout.run)
    if not picked:
        raise OrchError(
            f"run {ctx.layout.run!r} has {len(rows)} rows: too few to probe (a probe takes at most a quarter)",
            hint="run it: `orch run` measures as it goes",
        )
    strata: dict[str, StratumCount] = {}
    for r in rows:
        s = strata.setdefault(r.stratum, StratumCount())
        s.rows += 1
        s.max_tokens += r.max_tokens
        s.est_prompt_tokens += len(r.line) // 4
    entry = carve_probe_chunk(ctx, picked)
    plan = plan_chunks(read_manifest(ctx.store, ctx.layout), ctx.spec.workers.count)
    write_plan(ctx.store, ctx.layout, probe_first_plan(plan, entry.chunk))
    probe = ProbeRecord(
        chunk=entry.chunk, rows=len(picked), share=len(picked) / len(rows), strata=strata, created_at=time.time()
    )
    # The rows' strata, in the probe chunk's order, ride along until measured.
    probe.samples = [
        RowSample(
            stratum=r.stratum,
            est_prompt_tokens=len(r.line) // 4,
            prompt_tokens=0,
            cached_tokens=0,
            completion_tokens=0,
            max_tokens=r.max_tokens,
            hit_max=False,
        )
        for r in picked
    ]
    ctx.store.put(ctx.layout.probe, probe.to_bytes())
    return probe


def _launch_and_wait(ctx: RunContext, probe: ProbeRecord, timeout_s: float, echo: Callable[[str], None]) -> None:
    from orchestrator.backends import backend_for
    from orchestrator.backends.base import LaunchRequest
    from orchestrator.controller.launch import worker_envs

    launcher = backend_for(ctx)
    envs = {**worker_envs(ctx, 0, os.environ), "ORCH_MAX_CHUNKS": "1"}
    jobs = launcher.launch([LaunchRequest(worker=0, name=f"orch-{ctx.layout.run}-probe", envs=envs)])
    job = jobs[0]
    echo(f"probe: worker 0 launched ({job}) on the {ctx.spec.backend} backend; waiting for {probe.chunk}")
    deadline = time.monotonic() + timeout_s
    while read_marker(ctx.store, ctx.layout, probe.chunk) is None:
        state = launcher.statuses([job]).get(job)
        if state is not None and state.state.is_terminal():
            if read_marker(ctx.store, ctx.layout, probe.chunk) is not None:
                break
            raise OrchError(
                f"the probe worker ({job}) ended {state.state.value} before its chunk {probe.chunk} was done",
                hint="`orch logs` shows why; `orch estimate --probe` again resumes the probe chunk",
            )
        if time.monotonic() > deadline:
            launcher.cancel([job])
            raise OrchError(f"the probe took over {timeout_s:.0f} s: cancelled", hint="a smaller --probe-share")
        time.sleep(POLL_S)
    _wait_for_last_beat(ctx, probe, lambda: _ended(launcher, job), deadline)


def _ended(launcher: Launcher, job: str) -> bool:
    state = launcher.statuses([job]).get(job)
    return state is not None and bool(state.state.is_terminal())


def _wait_for_last_beat(ctx: RunContext, probe: ProbeRecord, ended: Callable[[], bool], deadline: float) -> None:
    """The worker writes the chunk's done marker before its last heartbeat (exited: the whole chunk's
    engine seconds). Measured at the marker, a 44-row probe read a beat from mid-chunk: 0.23 s of
    engine time for 30,703 prompt tokens (bench/forecast_bench.py, 2026-11-26)."""
    marker = read_marker(ctx.store, ctx.layout, probe.chunk)
    while marker is not None and time.monotonic() < deadline:
        beat = newest_heartbeat_of(ctx.store, ctx.layout, marker.holder)
        if (beat is not None and beat.state == "exited") or ended():
            return
        time.sleep(POLL_S)


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
                "rows": probe.rows,
                "share": round(probe.share, 4),
                "strata": len(probe.strata),
                "accelerator": probe.accelerator,
                "engine_s": busy,
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

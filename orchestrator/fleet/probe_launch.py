"""A probe's workers: one per candidate accelerator, launched through the run's backend, watched
until each chunk is done, its job ended or its share of the budget spent (then cancelled).

Each probe's worker is the one whose list the plan starts with its probe chunk (a worker of the
probe's model pool: probe_carve.probe_first_plan), launched with ORCH_MAX_CHUNKS=1 and its pool's
model; on SkyPilot pinned to its GPU type, spot. A candidate's share of `--probe-budget`
buys so many seconds of its spot price (the price table's cheapest cloud, times gpus_per_worker),
counted from its launch (a machine is paid from provisioning on; a probe waited on again by a later
estimate keeps the clock of its launch); one whose share buys less than a start-up is not launched
at all. A probe on this machine or on a cluster of CPUs has no price.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Sequence

from orchestrator.backends.base import Launcher, LaunchRequest
from orchestrator.core.context import RunContext
from orchestrator.core.errors import LaunchFailed, OrchError
from orchestrator.core.protocol.heartbeats import newest_heartbeat_of
from orchestrator.core.records import PlanRecord, read_marker, read_plan
from orchestrator.core.records.forecast import ProbeRecord
from orchestrator.prepare.probe_carve import probe_workers

#: How often the probe's chunks and jobs are looked at while they run.
POLL_S = 1.0
BUDGET_HINT = "a larger --probe-budget, or fewer GPU types in resources.gpus"


@dataclasses.dataclass(frozen=True)
class Stop:
    """Why a candidate's probe measured nothing."""

    reason: str
    hint: str
    budget: bool = False  # its budget was spent: not launched again


@dataclasses.dataclass(frozen=True)
class Cap:
    """What a candidate's probe may spend: seconds of its spot price."""

    seconds: float
    usd_h: float

    def usd(self) -> float:
        return self.seconds / 3600 * self.usd_h


def on(probe: ProbeRecord) -> str:
    """The probe's target as a user reads it: " of <model>", " on <gpu>", both or neither."""
    return target_name(probe.model, probe.gpu)


def target_name(model: str | None, gpu: str | None) -> str:
    return (f" of {model}" if model else "") + (f" on {gpu}" if gpu else "")


def budget_caps(ctx: RunContext, probes: Sequence[ProbeRecord], budget_usd: float) -> dict[str, Cap]:
    """Each priced candidate's equal share of the budget, per probe chunk. Shared among all the run's
    probes, finished or not: a candidate measured by an earlier estimate has had its share."""
    from orchestrator.planning.pricing import load_gpu_table

    prices = load_gpu_table()
    priced = [p for p in probes if p.gpu is not None]
    caps = {}
    for p in priced:
        assert p.gpu is not None
        usd_h = prices.per_machine(ctx.for_pool(p.model).spec.resources.gpus_per_worker).get(p.gpu).spot_usd_h
        caps[p.chunk] = Cap(budget_usd / len(priced) / usd_h * 3600, usd_h)
    return caps


def launch_and_wait(
    ctx: RunContext,
    probes: Sequence[ProbeRecord],
    unfinished: Sequence[ProbeRecord],
    budget_usd: float,
    timeout_s: float,
    echo: Callable[[str], None],
    launcher: Launcher,
    launched: Callable[[ProbeRecord, str], None] = lambda _p, _job: None,
) -> dict[str, Stop]:
    """Launch a worker for each unfinished probe (`launched` keeps its job) and wait until each chunk
    is done, its job ended, or its budget spent. A probe whose recorded job still runs (an estimate
    interrupted before) is waited on, not launched again. Returns the probe chunks that stopped, and why."""
    from orchestrator.planning.estimate import RESTART_OVERHEAD_S

    caps = budget_caps(ctx, probes, budget_usd)
    stopped: dict[str, Stop] = {}
    requests: dict[int, tuple[ProbeRecord, LaunchRequest]] = {}
    plan, worker_of = _planned_workers(ctx, unfinished)
    running = live_probe_jobs(launcher, unfinished)
    for p in unfinished:
        if p.chunk in running:
            echo(f"probe{on(p)}: worker {worker_of[p.chunk]} ({p.job}) still runs: waiting for {p.chunk} again")
            continue
        cap = caps.get(p.chunk)
        if cap is not None and cap.seconds < RESTART_OVERHEAD_S:
            stopped[p.chunk] = Stop(
                f"not launched: its share of the budget (${cap.usd():,.2f}) buys {cap.seconds:,.0f} s of a spot "
                f"{p.gpu} at ${cap.usd_h:,.2f}/h, less than a start-up ({RESTART_OVERHEAD_S:.0f} s)",
                BUDGET_HINT,
                budget=True,
            )
            continue
        requests[worker_of[p.chunk]] = (p, _request(ctx, worker_of[p.chunk], p, plan))
    try:
        jobs = launcher.launch([r for _, r in requests.values()]) if requests else {}
    except LaunchFailed as e:
        jobs = e.launched
        for worker, reason in e.failures.items():
            p = requests[worker][0]
            stopped[p.chunk] = Stop(f"the probe{on(p)} was not launched: {reason}", e.hint or "")
    waiting = {requests[w][0].chunk: (requests[w][0], job) for w, job in jobs.items()}
    for p, job in waiting.values():
        launched(p, job)
        echo(
            f"probe{on(p)}: worker {worker_of[p.chunk]} launched ({job}) on the {ctx.spec.backend} backend; "
            f"waiting for {p.chunk}"
        )
    waiting |= {p.chunk: (p, p.job) for p in unfinished if p.chunk in running and p.job is not None}
    started = time.monotonic()
    # Each budget counts from its job's launch: a probe launched by an earlier estimate has been paid since.
    now = time.time()
    since = {c: started - max(0.0, now - (p.launched_at or now)) for c, (p, _) in waiting.items()}
    while waiting:
        for chunk, (p, job) in list(waiting.items()):
            over, stop = _check(ctx, launcher, p, job, caps.get(chunk), since[chunk], started, timeout_s)
            if stop is not None:
                stopped[chunk] = stop
            if over:
                del waiting[chunk]
        if waiting:
            time.sleep(POLL_S)
    return stopped


def _planned_workers(ctx: RunContext, probes: Sequence[ProbeRecord]) -> tuple[PlanRecord | None, dict[str, int]]:
    """The run's plan and the worker each probe chunk heads the list of (probe_carve.probe_first_plan's)."""
    plan = read_plan(ctx.store, ctx.layout)
    worker_of = probe_workers(plan, [p.chunk for p in probes]) if plan is not None else {}
    if missing := [p.chunk for p in probes if p.chunk not in worker_of]:
        raise OrchError(
            f"the run's plan starts no worker's list with the probe chunk(s) {', '.join(missing)}: it was "
            "planned again since the probe was carved",
            hint="`orch run` answers them as any chunk; or remove the run and `orch estimate --probe` again",
            where=ctx.layout.plan,
        )
    return plan, worker_of


def live_probe_jobs(launcher: Launcher, probes: Sequence[ProbeRecord]) -> set[str]:
    """The probe chunks whose recorded job is live now."""
    jobs = {p.job: p.chunk for p in probes if p.job is not None and p.busy_s is None}
    states = launcher.statuses(list(jobs)) if jobs else {}
    return {chunk for job, chunk in jobs.items() if job in states and states[job].state.is_live()}


def _request(ctx: RunContext, worker: int, probe: ProbeRecord, plan: PlanRecord | None) -> LaunchRequest:
    """The run's launch request for `worker` (of the probe's pool in `plan`), one chunk long; on
    SkyPilot pinned to its candidate, spot."""
    from orchestrator.fleet.launch import launch_request

    r = launch_request(ctx, worker, os.environ, use_spot=True if probe.gpu else None, plan=plan)
    target = "".join(f"-{re.sub(r'[^a-z0-9]+', '-', x.lower())}" for x in (probe.model, probe.gpu) if x)
    return dataclasses.replace(
        r,
        name=f"orch-{ctx.layout.run}-probe{target}",
        envs={**r.envs, "ORCH_MAX_CHUNKS": "1"},
        gpus=[probe.gpu] if probe.gpu else None,
    )


def _check(
    ctx: RunContext,
    launcher: Launcher,
    probe: ProbeRecord,
    job: str,
    cap: Cap | None,
    since: float,
    started: float,
    timeout_s: float,
) -> tuple[bool, Stop | None]:
    """One look at a probe's job: (over, why it stopped). Over once its chunk is done (its last beat
    awaited), or with a reason once it ended first or was cancelled at its budget (counted from
    `since`, its launch) or at this estimate's timeout (from `started`; both time.monotonic())."""
    deadline = started + timeout_s
    if read_marker(ctx.store, ctx.layout, probe.chunk) is not None:
        _wait_for_last_beat(ctx, probe, lambda: _ended(launcher, job), deadline)
        return True, None
    state = launcher.statuses([job]).get(job)
    if state is not None and state.state.is_terminal():
        if read_marker(ctx.store, ctx.layout, probe.chunk) is not None:
            return False, None  # done as it ended: measured on the next look
        return True, Stop(
            f"the probe worker{on(probe)} ({job}) ended {state.state.value} before its chunk {probe.chunk} was done",
            "`orch logs` shows why; `orch estimate --probe` again resumes the probe chunk",
        )
    now = time.monotonic()
    if cap is not None and now - since > cap.seconds:
        launcher.cancel([job])
        return True, Stop(
            f"cancelled at its budget (${cap.usd():,.2f}: {cap.seconds:,.0f} s of a spot {probe.gpu} "
            f"at ${cap.usd_h:,.2f}/h)",
            BUDGET_HINT,
            budget=True,
        )
    if now > deadline:
        launcher.cancel([job])
        return True, Stop(f"the probe{on(probe)} took over {timeout_s:.0f} s: cancelled", "a smaller --probe-share")
    return False, None


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

"""`orch status`: one view of a run, from a handful of requests: listings, never one request per chunk.

1. `gather` reads the manifest, the plan, the jobs and prepare records (4 GETs), and lists `done/`,
   `stats/` (each finished chunk's numbers are in its stats key), `heartbeats/` (each worker's
   state is in its key), `leases/` and `decisions/` (plus one GET of the latest, if any): one
   request per 1,000 objects. Markers say what is done; stats are a cache of their numbers, used
   only for chunks whose marker exists. A done chunk without a stats entry (a crash between the
   two writes) costs one GET of its marker. A lease no live heartbeat accounts for is read, to name
   a corrupt one. Once every chunk has a marker, every marker is read and the parts listed
   (checkpoints.find_damage): a run is complete only when nothing is damaged. The backend is
   asked for the state of each worker's current job.
2. `derive_status` turns those facts into the view: plain data, no I/O.
3. `status_view` (a rich renderable) and `to_json` show it.

JSON shape (stable for scripts):
    run, backend, complete (bool: every chunk has a marker, and none is damaged), backend_note (str|null),
    damaged: {chunk: what is wrong} (corrupt markers, parts that do not match them; `orch redo` each),
    corrupt_leases: {key: what is wrong} (treated as expired once older than the lease TTL),
    chunks: {total, done},
    rows: {total, done (in finished chunks), in_progress (flushed or not, in chunks being worked on),
           errors (error rows in finished chunks), set_aside (input rows prepare set aside: not in
           total; collect answers them with error lines)},
    throughput: {rows_per_s, tokens_per_s} (sum over running workers), eta_s (null when unknown),
    overall: {wall_s, rows_per_s, tokens_per_s} | null (the finished chunks' pace, from the first
             launch, or the first chunk's start without one, to the last chunk's end),
    cost: {so_far_usd, worker_hours} (per-GPU-hour prices x workers' uptime, restarts included),
    workers: [{worker, state, job_id, recovery_count, accelerator, cloud, region, spot, chunk,
               chunk_rows, chunk_rows_done, chunks_assigned, chunks_done_of_own_list, chunks_finished
               (by this worker, from any list), rows_done, tokens_per_s, rows_per_s, heartbeat_state,
               heartbeat_age_s, uptime_s, failure_reason (why its current job failed) | null,
               log (its log file, or the command that shows it) | null}],
    estimate: {gpu, workers, tokens_per_s_per_worker, measured, spot_hours, spot_usd, on_demand_hours,
               on_demand_usd} | null (what is left, on the fleet any_of picks; orchestrator/estimate.py),
    deadline: the deadline policy's latest decision | null ({at, deadline_s, budget_usd, action,
              mode, reason, launch, retire, elapsed_s, progress, line, need_rows_per_s,
              have_rows_per_s, slack_s}; orchestrator/controller/deadline.py)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.backends.base import STATE_COLOURS, JobState, JobStatus, Launcher, attempt_statuses
from orchestrator.console import Group, Text, table
from orchestrator.core import worker_ids
from orchestrator.core.protocol.checkpoints import find_damage, read_chunk_stats
from orchestrator.core.protocol.heartbeats import is_beating, read_heartbeats
from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.protocol.snapshot import list_done
from orchestrator.core.records import (
    ChunkStats,
    CorruptRecord,
    DecisionRecord,
    HeartbeatSummary,
    JobAttempt,
    JobsRecord,
    Lease,
    ManifestEntry,
    PlanRecord,
    PrepareRecord,
    read_jobs,
    read_manifest,
    read_marker,
    read_plan,
    read_record,
)
from orchestrator.core.store import Store
from orchestrator.pricing import GpuTable

#: The columns of the workers table.
WORKER_COLUMNS = (
    "worker",
    "state",
    "accel",
    "where",
    "spot",
    "chunk",
    "progress",
    "own done",
    "finished",
    "tok/s",
    "beat",
)


@dataclass
class RunFacts:
    run: str
    manifest: list[ManifestEntry]
    plan: PlanRecord | None
    jobs: JobsRecord
    done: set[str]
    stats: dict[str, tuple[float, ChunkStats]]
    heartbeats: dict[str, HeartbeatSummary]
    statuses: dict[str, JobStatus] = field(default_factory=dict)
    backend_note: str | None = None
    #: The deadline policy's latest decision (`orch watch --deadline`), if any.
    decision: DecisionRecord | None = None
    #: chunk -> what is wrong with its marker or parts (checked once every chunk has a marker).
    damaged: dict[str, str] = field(default_factory=dict)
    #: lease key -> what is wrong with it.
    corrupt_leases: dict[str, str] = field(default_factory=dict)
    #: Input rows set aside at prepare (answered by collect with error lines).
    set_aside: int = 0


def latest_decision(store: Store, layout: RunLayout) -> DecisionRecord | None:
    """The deadline policy's last decision: one listing (and one GET when there is one)."""
    keys = [info.key for info in store.list(layout.decisions_prefix)]
    if not keys:
        return None
    found = read_record(store, max(keys), DecisionRecord)
    return found[0] if found is not None else None


def gather(store: Store, layout: RunLayout, launcher: Launcher | None = None) -> RunFacts:
    manifest = read_manifest(store, layout)
    plan = read_plan(store, layout)
    jobs, _ = read_jobs(store, layout)
    done = set(list_done(store, layout))
    stats = read_chunk_stats(store, layout)
    for chunk in done - set(stats):
        with contextlib.suppress(Exception):  # a marker we cannot read is shown as done without numbers
            marker = read_marker(store, layout, chunk)
            if marker is not None:
                stats[chunk] = (marker.finished_at, marker.stats())
    heartbeats = read_heartbeats(store, layout)
    chunks = [e.chunk for e in manifest]
    facts = RunFacts(
        layout.run,
        manifest,
        plan,
        jobs,
        done,
        stats,
        heartbeats,
        decision=latest_decision(store, layout),
        damaged=find_damage(store, layout, chunks) if chunks and done.issuperset(chunks) else {},
        corrupt_leases=_corrupt_leases(store, layout, done, heartbeats),
    )
    prepared = read_record(store, layout.prepare_record, PrepareRecord)
    facts.set_aside = prepared[0].errors if prepared is not None else 0
    current = list(jobs.current_jobs().values())
    if launcher is not None and current:
        try:
            facts.statuses = attempt_statuses(launcher, current, time.time())
        except Exception as e:  # the backend's own trouble must not hide what the store knows
            facts.backend_note = f"cannot ask the {getattr(launcher, 'name', 'backend')} backend: {e}"
    return facts


def _corrupt_leases(
    store: Store, layout: RunLayout, done: set[str], heartbeats: dict[str, HeartbeatSummary]
) -> dict[str, str]:
    """Leases of unfinished chunks that no heartbeat names, read to find those that do not parse."""
    in_hand = {hb.chunk for hb in heartbeats.values() if hb.chunk}
    out = {}
    for info in store.list(layout.leases_prefix):
        chunk = layout.chunk_of(info.key, layout.leases_prefix)
        if chunk in done or chunk in in_hand:
            continue
        try:
            read_record(store, info.key, Lease)
        except CorruptRecord as e:
            written = time.strftime("%H:%M:%S", time.localtime(info.modified))
            out[info.key] = f"{e.message}; written {written}, treated as expired once older than the lease TTL"
    return out


@dataclass
class WorkerView:
    worker: str
    state: str
    job_id: str | None = None
    recovery_count: int = 0
    accelerator: str | None = None
    cloud: str | None = None
    region: str | None = None
    spot: bool | None = None
    chunk: str | None = None
    chunk_rows: int = 0
    chunk_rows_done: int = 0
    chunks_assigned: int = 0
    chunks_done_of_own_list: int = 0
    chunks_finished: int = 0
    rows_done: int = 0
    tokens_per_s: float = 0.0
    rows_per_s: float = 0.0
    heartbeat_state: str | None = None
    heartbeat_age_s: float | None = None
    uptime_s: float = 0.0
    #: Why the current job failed (a local worker's: its exit and its log's last error line).
    failure_reason: str | None = None
    #: Where the current job's log is: a file, or the command that shows it.
    log: str | None = None


@dataclass
class RunStatus:
    run: str
    backend: str | None
    complete: bool
    backend_note: str | None
    chunks: dict[str, int]
    rows: dict[str, int]
    throughput: dict[str, float]
    eta_s: float | None
    cost: dict[str, float]
    workers: list[WorkerView]
    #: What is left, on the fleet any_of would pick (`orch plan --estimate`'s fleet line); None
    #: when no GPU candidates were given.
    estimate: dict[str, Any] | None = None
    #: The deadline policy's latest decision, with its reason and numbers.
    deadline: dict[str, Any] | None = None
    #: The finished chunks' pace: what a complete run shows instead of live throughput.
    overall: dict[str, float] | None = None
    #: chunk -> what is wrong with its marker or parts: the run is not complete until redone.
    damaged: dict[str, str] = field(default_factory=dict)
    #: lease key -> what is wrong with it.
    corrupt_leases: dict[str, str] = field(default_factory=dict)


def derive_status(
    facts: RunFacts,
    *,
    now: float,
    prices: GpuTable,
    heartbeat_interval: float = 10.0,
    default_spot: bool = True,
    gpus: Sequence[str] | None = None,
    workers_planned: int | None = None,
) -> RunStatus:
    rows_by_chunk = {e.chunk: e.rows for e in facts.manifest}
    done = facts.done & set(rows_by_chunk)
    rows_done = sum(rows_by_chunk[c] for c in done)
    errors = sum(s.errors for c, (_, s) in facts.stats.items() if c in done)
    finished_by: dict[str, int] = {}
    for chunk, (_, s) in facts.stats.items():
        if chunk in done:  # stats are a cache of the markers
            finished_by[s.worker] = finished_by.get(s.worker, 0) + 1

    own = {str(a.worker): a.chunks for a in (facts.plan.workers if facts.plan else [])}
    current = {str(w): a for w, a in facts.jobs.current_jobs().items()}
    recoveries = {w: len(wj.attempts) - 1 for w, wj in facts.jobs.workers.items()}
    names = sorted(set(own) | set(current) | set(facts.heartbeats), key=worker_ids.sort_key)
    workers, in_progress, rows_per_s, tokens_per_s, cost, hours = [], 0, 0.0, 0.0, 0.0, 0.0
    for name in names:
        base = worker_ids.job_worker(name)
        attempt = current.get(name) or current.get(base)
        status = facts.statuses.get(attempt.job_id) if attempt else None
        hb = facts.heartbeats.get(name)
        age = now - hb.updated_at if hb else None
        live = hb if hb is not None and is_beating(hb, now=now, heartbeat_interval=heartbeat_interval) else None
        view = WorkerView(
            worker=name,
            state=(status.state.value if status else JobState.UNKNOWN.value) if attempt else "NOT LAUNCHED",
            job_id=attempt.job_id if attempt else None,
            recovery_count=(status.recovery_count if status else 0) + max(recoveries.get(base, 0), 0),
            accelerator=(hb.accelerator if hb else None) or (status.accelerator if status else None),
            cloud=(hb.cloud if hb else None) or (status.cloud if status else None),
            region=(hb.region if hb else None) or (status.region if status else None),
            spot=hb.spot if hb is not None and hb.spot is not None else (status.spot if status else None),
            chunk=live.chunk if live else None,
            chunk_rows=live.chunk_rows if live else 0,
            chunk_rows_done=live.chunk_rows_done if live else 0,
            chunks_assigned=len(own.get(name, ())),
            chunks_done_of_own_list=sum(1 for c in own.get(name, ()) if c in done),
            chunks_finished=finished_by.get(name, 0),
            rows_done=hb.rows_done if hb else 0,
            tokens_per_s=live.tokens_per_s if live else 0.0,
            rows_per_s=live.rows_per_s if live else 0.0,
            heartbeat_state=hb.state if hb else None,
            heartbeat_age_s=round(age, 1) if age is not None else None,
            uptime_s=round(hb.uptime_s, 1) if hb else 0.0,
            failure_reason=_failure(status, attempt),
            log=status.log if status else None,
        )
        if live and view.chunk:
            in_progress += view.chunk_rows_done
            rows_per_s += live.rows_per_s
            tokens_per_s += view.tokens_per_s
        gpu = prices.find(view.accelerator)
        hours += view.uptime_s / 3600
        if gpu is not None:
            spot = view.spot if view.spot is not None else default_spot
            cost += view.uptime_s / 3600 * gpu.price(spot, view.cloud)
        workers.append(view)

    total_rows = sum(rows_by_chunk.values())
    remaining = total_rows - rows_done - in_progress
    eta = remaining / rows_per_s if rows_per_s > 0 and remaining > 0 else (0.0 if remaining <= 0 else None)
    return RunStatus(
        run=facts.run,
        backend=facts.jobs.backend,
        complete=len(done) == len(rows_by_chunk) and not facts.damaged,
        backend_note=facts.backend_note,
        chunks={"total": len(rows_by_chunk), "done": len(done)},
        rows={
            "total": total_rows,
            "done": rows_done,
            "in_progress": in_progress,
            "errors": errors,
            "set_aside": facts.set_aside,
        },
        throughput={"rows_per_s": round(rows_per_s, 3), "tokens_per_s": round(tokens_per_s, 1)},
        eta_s=round(eta, 1) if eta is not None else None,
        cost={"so_far_usd": round(cost, 2), "worker_hours": round(hours, 3)},
        workers=workers,
        estimate=_estimate(facts, prices, gpus, workers_planned) if gpus else None,
        deadline=facts.decision.model_dump() if facts.decision is not None else None,
        overall=_overall([s for c, s in facts.stats.items() if c in done], facts.jobs),
        damaged=dict(facts.damaged),
        corrupt_leases=dict(facts.corrupt_leases),
    )


def _failure(status: JobStatus | None, attempt: JobAttempt | None) -> str | None:
    """Why the worker's current job failed: the backend's word, else what the controller recorded."""
    if status is None or not status.state.value.startswith("FAILED"):
        return None
    return status.failure_reason or (attempt.failure_reason if attempt else None) or status.state.value


def _overall(finished: Sequence[tuple[float, ChunkStats]], jobs: JobsRecord) -> dict[str, float] | None:
    """The run's pace as its user lived it: from the first launch (workers start, load the model)
    to the last chunk's end. Workers started by hand leave no launch: then from the first chunk's start."""
    if not finished:
        return None
    launches = [a.launched_at for w in jobs.workers.values() for a in w.attempts]
    began = min([at - s.seconds for at, s in finished] + launches)
    wall = max(max(at for at, _ in finished) - began, 1e-3)
    return {
        "wall_s": round(wall, 1),
        "rows_per_s": round(sum(s.rows for _, s in finished) / wall, 3),
        "tokens_per_s": round(sum(s.tokens_out for _, s in finished) / wall, 1),
    }


def _estimate(facts: RunFacts, prices: GpuTable, gpus: Sequence[str], workers: int | None) -> dict[str, Any] | None:
    from orchestrator.estimate import estimate

    try:
        est = estimate(
            prices,
            gpus,
            workers or max(len(facts.plan.workers) if facts.plan else 1, 1),
            facts.manifest,
            facts.stats,
            facts.done,
        )
    except Exception:  # an unknown GPU name in the spec: the status itself must still show
        return None
    f = est.fleet
    return {
        "gpu": f.gpu,
        "workers": est.workers,
        "tokens_per_s_per_worker": f.tokens_per_s,
        "measured": f.measured,
        "spot_hours": f.spot_hours,
        "spot_usd": f.spot_usd,
        "on_demand_hours": f.on_demand_hours,
        "on_demand_usd": f.on_demand_usd,
    }


def to_json(status: RunStatus) -> dict[str, Any]:
    return asdict(status)


def status_view(status: RunStatus) -> Group:
    """The run at a glance: the head lines, then one row per worker (orchestrator.console prints it)."""
    c, r = status.chunks, status.rows
    pct = 100 * c["done"] / c["total"] if c["total"] else 100.0
    eta = _duration(status.eta_s) if status.eta_s is not None else "unknown"
    title = Text.assemble((f"run {status.run}", "bold"), f"  ({status.backend or 'not launched'})")
    if status.complete:
        title.append("  COMPLETE", style="bold green")
    head: list[Text] = [
        title,
        Text(
            f"chunks {c['done']}/{c['total']} ({pct:.0f}%)   rows {r['done']:,}/{r['total']:,} done"
            f" (+{r['in_progress']:,} in progress)   errors {r['errors']:,}"
            + (f"   set aside at prepare {r['set_aside']:,}" if r.get("set_aside") else "")
        ),
        Text(_pace_line(status, eta)),
    ]
    if status.estimate and not status.complete:
        e = status.estimate
        head.append(
            Text(
                f"estimate left on {e['workers']} x {e['gpu']} ({'measured' if e['measured'] else 'table'} "
                f"{e['tokens_per_s_per_worker']:,.0f} tok/s each): {_duration(e['spot_hours'] * 3600)} / "
                f"${e['spot_usd']:,.2f} on spot, {_duration(e['on_demand_hours'] * 3600)} / "
                f"${e['on_demand_usd']:,.2f} on demand"
            )
        )
    if status.deadline:
        d = status.deadline
        colour = {"critical": "red", "behind": "yellow"}.get(str(d.get("mode")), "green")
        head.append(
            Text.assemble(
                (f"deadline {_duration(d['deadline_s'])}", "bold"),
                (f" [{d.get('mode')}]", colour),
                f" progress {d.get('progress', 0):.1%} vs line {d.get('line', 0):.1%}; last decision: "
                f"{d.get('action')}: {d.get('reason')}"
                + (f" (budget ${d['budget_usd']:,.2f})" if d.get("budget_usd") else ""),
            )
        )
    if status.backend_note:
        head.append(Text(f"warning: {status.backend_note}", style="yellow"))
    if status.damaged:
        head.append(
            Text(f"DAMAGED: {len(status.damaged)} chunk(s) have a marker but cannot be collected:", style="red")
        )
        head.extend(Text(f"  {chunk}: {why}", style="red") for chunk, why in sorted(status.damaged.items()))
        chunks = " ".join(f"--chunk {chunk}" for chunk in sorted(status.damaged))
        head.append(Text(f"  run them again: orch redo --run {status.run} {chunks}, then orch resume --follow"))
    for key, why in sorted(status.corrupt_leases.items()):
        head.append(Text(f"warning: {key} is not a lease ({why})", style="yellow"))
    workers = table(*WORKER_COLUMNS, right=("finished", "tok/s"))
    for w in status.workers:
        state = w.state + (f" (recovered {w.recovery_count}x)" if w.recovery_count else "")
        colour = STATE_COLOURS.get(JobState(w.state), "white") if w.state in JobState.__members__ else "white"
        workers.add_row(
            w.worker,
            Text(state, style=colour),
            w.accelerator or "-",
            "/".join(x for x in (w.cloud, w.region) if x) or "-",
            {True: "spot", False: "on-dem", None: "-"}[w.spot],
            w.chunk or "-",
            f"{w.chunk_rows_done}/{w.chunk_rows}" if w.chunk else "-",
            f"{w.chunks_done_of_own_list}/{w.chunks_assigned}",
            str(w.chunks_finished),
            f"{w.tokens_per_s:,.0f}" if w.chunk else "-",
            _duration(w.heartbeat_age_s) + " ago" if w.heartbeat_age_s is not None else "-",
        )
    failures = [
        Text.assemble(
            (f"worker {w.worker} failed: ", "red"), str(w.failure_reason), f"\n  log: {w.log}" if w.log else ""
        )
        for w in status.workers
        if w.failure_reason
    ]
    return Group(*head, Text(""), *([workers] if status.workers else []), *failures)


def _pace_line(status: RunStatus, eta: str) -> str:
    cost = f"cost so far ${status.cost['so_far_usd']:,.2f} ({status.cost['worker_hours']:.2f} worker-hours)"
    o = status.overall
    if status.complete and o:
        return (
            f"finished in {_duration(o['wall_s'])}: {o['rows_per_s']:,.2f} rows/s, {o['tokens_per_s']:,.0f} tok/s"
            f" over the run   {cost}"
        )
    t = status.throughput
    return f"throughput {t['rows_per_s']:.2f} rows/s, {t['tokens_per_s']:,.0f} tok/s   ETA {eta}   {cost}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def status_of(
    store: Store,
    layout: RunLayout,
    launcher: Launcher | None,
    *,
    now: float,
    prices: GpuTable,
    heartbeat_interval: float = 10.0,
    default_spot: bool = True,
    gpus: Sequence[str] | None = None,
    workers_planned: int | None = None,
) -> RunStatus:
    return derive_status(
        gather(store, layout, launcher),
        now=now,
        prices=prices,
        heartbeat_interval=heartbeat_interval,
        default_spot=default_spot,
        gpus=gpus,
        workers_planned=workers_planned,
    )

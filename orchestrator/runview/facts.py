"""What `orch status` reads from the store and the backend (step 1 of runview/status.py): the
run's facts, from a handful of listings and GETs whatever its size; `derive_status` makes the view."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from orchestrator.backends.base import JobStatus, Launcher, attempt_statuses
from orchestrator.core.errors import CorruptRecord, OrchError
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.pools import machine_gpus
from orchestrator.core.protocol.checkpoints import checkpointed_rows, find_damage, read_chunk_stats
from orchestrator.core.protocol.claims import pool_of
from orchestrator.core.protocol.heartbeats import read_heartbeats
from orchestrator.core.protocol.snapshot import list_done
from orchestrator.core.records import (
    ChunkStats,
    DecisionRecord,
    HeartbeatSummary,
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
from orchestrator.core.records.forecast import ForecastRecord
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import Store
from orchestrator.core.worker_ids import job_worker


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
    #: Input rows answered by earlier runs (--reuse-from): in no chunk.
    reused: int = 0
    #: When prepare finished (its record's time), None when not known.
    prepared_at: float | None = None
    #: `orch estimate`'s forecast (forecast.json), None without one.
    forecast: ForecastRecord | None = None
    #: chunk -> rows checkpointed so far, for chunks without a marker (from part names).
    checkpointed: dict[str, int] = field(default_factory=dict)
    #: worker -> how many replica processes ("3r0", "3r1") have beaten for it (none: one engine).
    replicas: dict[str, int] = field(default_factory=dict)
    #: GPUs a worker's machine has (core/pools.machine_gpus: per model pool, None for the run's own
    #: resources), read when first needed (`load_machine_gpus`): its machine is paid for all of them.
    machine_gpus: dict[str | None, int] | None = None
    load_machine_gpus: Callable[[], dict[str | None, int]] = dict

    def machine_gpus_of(self, pool: str | None) -> int:
        """GPUs a machine of `pool` has (None: the run's resources)."""
        if self.machine_gpus is None:
            self.machine_gpus = self.load_machine_gpus()
        return self.machine_gpus.get(pool, self.machine_gpus.get(None, 1))

    def gpus_of(self, worker: str) -> float:
        """The GPUs one process of `worker` ("3", or a replica "3r1") is paid for: its machine's,
        shared by the replicas running on it."""
        base = job_worker(worker)
        gpus = self.machine_gpus_of(pool_of(self.plan, int(base)) if self.plan and base.isdigit() else None)
        return float(gpus) if worker == base else gpus / max(self.replicas.get(base, 0), 1)


def latest_decision(store: Store, layout: RunLayout) -> DecisionRecord | None:
    """The deadline policy's last decision: one listing (and one GET when there is one)."""
    keys = [info.key for info in store.list(layout.decisions_prefix)]
    if not keys:
        return None
    found = read_record(store, max(keys), DecisionRecord)
    return found[0] if found is not None else None


def gather(store: Store, layout: RunLayout, launcher: Launcher | None = None, spec: RunSpec | None = None) -> RunFacts:
    """`spec`: the run's, as the command resolved it; without it, the spec frozen into the run is
    read (once, when a worker's cost needs its machine's GPUs)."""
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
    facts.checkpointed = checkpointed_rows(store, layout, set(chunks) - done)
    prepared = read_record(store, layout.prepare_record, PrepareRecord)
    facts.set_aside = prepared[0].errors if prepared is not None else 0
    facts.reused = prepared[0].reused if prepared is not None else 0
    facts.forecast = (read_record(store, layout.forecast, ForecastRecord) or (None,))[0]
    facts.prepared_at = prepared[0].created_at or None if prepared is not None else None
    facts.replicas = dict(Counter(job_worker(w) for w in heartbeats if job_worker(w) != w))
    facts.load_machine_gpus = (
        (lambda: machine_gpus(spec)) if spec is not None else (lambda: _machine_gpus(store, layout))
    )
    current = list(jobs.current_jobs().values())
    if launcher is not None and current:
        try:
            facts.statuses = attempt_statuses(launcher, current, time.time())
        except Exception as e:  # the backend's own trouble must not hide what the store knows
            facts.backend_note = f"cannot ask the {getattr(launcher, 'name', 'backend')} backend: {e}"
    return facts


def _machine_gpus(store: Store, layout: RunLayout) -> dict[str | None, int]:
    """core/pools.machine_gpus of the spec frozen into the run."""
    stored = read_stored_spec(store, layout)
    if stored is None:
        return {}
    try:
        return machine_gpus(RunSpec.model_validate(stored[0]))
    except (ValidationError, OrchError):  # a spec this version cannot read: one GPU a machine
        return {}


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

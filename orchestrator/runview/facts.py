"""What the read model reads from the store and the backend (step 1 of runview/status.py): the
run's facts, from a handful of listings and GETs whatever its size; `derive_status` makes the view.

A reading goes as deep as its caller needs (`Depth`): a narrow read (the cost so far, a batch's
counts) skips what only the whole status shows, and derives its numbers with the same functions."""

from __future__ import annotations

import contextlib
import enum
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from orchestrator.runview.arms import ArmTally, finished_lines, tally_arms
from orchestrator.runview.cascade import stages_status
from orchestrator.runview.sections import StageView


class Depth(enum.IntEnum):
    """How much of the run a reading reads (each depth reads what the ones before it do)."""

    #: The manifest, the done markers, the chunks' stats and the prepare record: 2 GETs, 2 listings.
    CHUNKS = 1
    #: And the plan, the jobs and the heartbeats: each worker's machine time and cost.
    WORKERS = 2
    #: And what only the whole status shows: the backend's job states, damage, corrupt leases, the
    #: deadline's decision, the forecast, checkpointed rows, the run's model, a sweep's arms and a
    #: cascade's stages.
    FULL = 3


@dataclass
class RunFacts:
    run: str
    manifest: list[ManifestEntry]
    done: set[str]
    stats: dict[str, tuple[float, ChunkStats]]
    plan: PlanRecord | None = None
    jobs: JobsRecord = field(default_factory=JobsRecord)
    heartbeats: dict[str, HeartbeatSummary] = field(default_factory=dict)
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
    #: What prepare read: the file, or the folder its files share and how many (None: not recorded).
    input: str | None = None
    #: The model the run froze (a run of several: their served names), None until a command named one.
    model: str | None = None
    #: The backend the frozen spec names (workers that beat with no launch recorded run on it).
    spec_backend: str | None = None
    #: `orch estimate`'s forecast (forecast.json), None without one.
    forecast: ForecastRecord | None = None
    #: chunk -> rows checkpointed so far, for chunks without a marker (from part names).
    checkpointed: dict[str, int] = field(default_factory=dict)
    #: worker -> how many replica processes ("3r0", "3r1") have beaten for it (none: one engine).
    replicas: dict[str, int] = field(default_factory=dict)
    #: A sweep: each arm's rows, errors and tokens in the finished chunks (None: not a sweep).
    arm_tallies: dict[str, ArmTally] | None = None
    #: A cascade: each stage's rows (empty: not a cascade).
    stages: list[StageView] = field(default_factory=list)
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


def gather(
    store: Store,
    layout: RunLayout,
    launcher: Launcher | None = None,
    spec: RunSpec | None = None,
    *,
    depth: Depth = Depth.FULL,
) -> RunFacts:
    """The run's facts, as deep as `depth`. `spec`: the run's, as the command resolved it (a sweep's
    arms and a cascade's stages are read only with it); the spec frozen into the run is read once,
    when the run's model or a worker's machine is asked for.

    The backend is asked before the store is read: a worker it reports ended wrote its markers
    before it ended, so the listing after shows them (the other order could show a worker that
    succeeded beside a chunk it finished, not done)."""
    asked = _ask_backend(store, layout, launcher) if launcher is not None and depth >= Depth.FULL else None
    manifest = read_manifest(store, layout)
    done = set(list_done(store, layout))
    stats = read_chunk_stats(store, layout)
    for chunk in done - set(stats):
        with contextlib.suppress(Exception):  # a marker we cannot read is shown as done without numbers
            marker = read_marker(store, layout, chunk)
            if marker is not None:
                stats[chunk] = (marker.finished_at, marker.stats())
    facts = RunFacts(layout.run, manifest, done, stats)
    prepared = read_record(store, layout.prepare_record, PrepareRecord)
    if prepared is not None:
        record = prepared[0]
        facts.set_aside, facts.reused, facts.prepared_at = record.errors, record.reused, record.created_at or None
        facts.input = _input_of(record)
    if depth < Depth.WORKERS:
        return facts
    stored = _StoredSpec(store, layout)
    facts.plan = read_plan(store, layout)
    facts.jobs = asked.jobs if asked is not None else read_jobs(store, layout)[0]
    facts.heartbeats = read_heartbeats(store, layout)
    facts.replicas = dict(Counter(job_worker(w) for w in facts.heartbeats if job_worker(w) != w))
    facts.load_machine_gpus = (lambda: machine_gpus(spec)) if spec is not None else stored.machine_gpus
    if depth < Depth.FULL:
        return facts
    if asked is not None:
        facts.statuses, facts.backend_note = asked.statuses, asked.note
    _gather_the_rest(facts, store, layout, spec, stored)
    return facts


@dataclass
class _Asked:
    """The jobs record and what the backend said of its current jobs."""

    jobs: JobsRecord
    statuses: dict[str, JobStatus]
    note: str | None = None


def _ask_backend(store: Store, layout: RunLayout, launcher: Launcher) -> _Asked:
    jobs, _ = read_jobs(store, layout)
    current = list(jobs.current_jobs().values())
    if not current:
        return _Asked(jobs, {})
    try:
        return _Asked(jobs, attempt_statuses(launcher, current, time.time()))
    except Exception as e:  # the backend's own trouble must not hide what the store knows
        return _Asked(jobs, {}, f"cannot ask the {getattr(launcher, 'name', 'backend')} backend: {e}")


def _gather_the_rest(
    facts: RunFacts,
    store: Store,
    layout: RunLayout,
    spec: RunSpec | None,
    stored: _StoredSpec,
) -> None:
    """What only the whole status shows (Depth.FULL)."""
    chunks = [e.chunk for e in facts.manifest]
    facts.decision = latest_decision(store, layout)
    facts.damaged = find_damage(store, layout, chunks) if chunks and facts.done.issuperset(chunks) else {}
    facts.corrupt_leases = _corrupt_leases(store, layout, facts.done, facts.heartbeats)
    facts.checkpointed = checkpointed_rows(store, layout, set(chunks) - facts.done)
    facts.forecast = (read_record(store, layout.forecast, ForecastRecord) or (None,))[0]
    facts.model = stored.model()
    facts.spec_backend = (stored.document() or {}).get("backend")
    facts.arm_tallies = read_arm_tallies(store, layout, facts, spec)
    if spec is not None and spec.sweep.cascade:
        facts.stages = stages_status(store, layout, spec.sweep.cascade)


def read_arm_tallies(
    store: Store, layout: RunLayout, facts: RunFacts, spec: RunSpec | None
) -> dict[str, ArmTally] | None:
    """A sweep's arms, counted from its finished chunks' answers (every one read: a sweep's status
    costs a GET per finished chunk part); None without a sweep."""
    if spec is None or not spec.sweep.arms:
        return None
    return tally_arms(finished_lines(store, layout, facts.manifest, facts.done), spec.sweep.arms)


class _StoredSpec:
    """The spec frozen into the run, read at most once, and only when asked for."""

    def __init__(self, store: Store, layout: RunLayout):
        self.store, self.layout = store, layout
        self._read: dict[str, Any] | None = None
        self._done = False

    def document(self) -> dict[str, Any] | None:
        if not self._done:
            found = read_stored_spec(self.store, self.layout)
            self._read, self._done = (found[0] if found is not None else None), True
        return self._read

    def model(self) -> str | None:
        """Its `model.name`; a run of several models: their served names."""
        doc = self.document() or {}
        several = doc.get("models") or {}
        name = ", ".join(several) if several else (doc.get("model") or {}).get("name")
        return name if isinstance(name, str) else None

    def machine_gpus(self) -> dict[str | None, int]:
        """core/pools.machine_gpus of it (a spec this version cannot read: one GPU a machine)."""
        doc = self.document()
        if doc is None:
            return {}
        try:
            return machine_gpus(RunSpec.model_validate(doc))
        except (ValidationError, OrchError):
            return {}


def _input_of(record: PrepareRecord) -> str | None:
    """What the run was prepared from: the file, or the folder the files share and how many."""
    uris = [str(s.get("uri")) for s in record.identity.get("sources", [])]
    if len(uris) <= 1:
        return uris[0] if uris else None
    # By "/"-separated parts, not os.path: `s3://bucket/x` keeps its double slash.
    parts = [uri.split("/")[:-1] for uri in uris]
    shared = [p[0] for p in itertools.takewhile(lambda p: len(set(p)) == 1, zip(*parts, strict=False))]
    folder = "/".join(shared) or "."
    return f"{folder}/ ({len(uris)} files)"


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

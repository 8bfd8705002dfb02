"""Every document a run keeps in the store, typed, and the one way to read and update them.

A run is a prefix of the store (`runs/<run>/`, key names in core/layout.py). What lives
there, by who writes it:

    prepare, plan        spec.yaml              SpecDocument (YAML): the frozen spec and its hash
                         manifest.jsonl         ManifestEntry, one line per chunk
                         prepare.json           PrepareRecord: what was prepared from what
                         prepare-errors.jsonl   PrepareError, one line per input row set aside
                         plan.json              PlanRecord (and workers/<i>.txt: chunk paths, plain text)
                         reuse.json             ReuseRecord: rows answered from earlier runs (--reuse-from)
                         reused/sources.bin     where each reused row's answer is (binary)
                         reused/ids.jsonl       each reused row's custom_id, in input order
    collect              answers/index.json     AnswerIndex: the sorted answer keys' parts
                         answers/<gen>/<n>.bin  an index part (binary)
    controller           jobs.json              JobsRecord: backend jobs per worker, every launch
                         cancel.json            CancelRecord: `orch cancel` was run; workers stop
                         adapters/<name>.json   AdapterManifest: a LoRA adapter shipped with the run
                         adapters/<name>/<file> its files (core/protocol/adapters.py)
                         decisions/<ms>.json    DecisionRecord: the deadline policy's log
                         zones.json             ZoneHistory: each zone's up spells, preemptions, waits
    workers              leases/<chunk>.json    Lease
                         outputs/<chunk>/<part> OpenAI Batch output lines (core/lines.py)
                         done/<chunk>.json      DoneMarker: the authoritative list of a chunk's parts
                         stats/<ms>.<chunk>.<…> ChunkStats, in the key name (listings only)
                         heartbeats/<w>/<…>     Heartbeat body, HeartbeatSummary in the key name

`orch serve` keeps its own objects under `serve/` (layout.ServeLayout); each batch is also a run:

    orch serve           files/<id>.json        StoredFile: an OpenAI file object and its owner
                         files/<id>.content     the file's bytes
                         batches/<id>.json      BatchDocument: an OpenAI batch object and its owner
                         active/<id>            (empty) a batch the server still drives
                         idempotency/<o>/<hash> IdempotencyRecord: the batch an Idempotency-Key made
                         owners/<o>/<kind>/<…>  (empty) an owner's files and batches, newest first

`read_record` is the one reader (a document that does not parse is a CorruptRecord naming its
key, never a traceback), and `cas_update` the one read-change-write loop (create-if-absent, then
compare-and-swap on the ETag, re-read and re-applied when another writer came first).
"""

from __future__ import annotations

from orchestrator.core.records.base import (
    CAS_ATTEMPTS,
    Document,
    KeyRecord,
    Record,
    cas_update,
    dumps,
    iter_jsonl,
    parse_record,
    read_jsonl,
    read_record,
    write_jsonl,
)
from orchestrator.core.records.reuse import AnswerIndex, IndexPart, ReuseRecord, ReuseSource
from orchestrator.core.records.run import (
    AdapterFile,
    AdapterManifest,
    CancelRecord,
    ChunkStats,
    DecisionRecord,
    DoneMarker,
    Heartbeat,
    HeartbeatSummary,
    JobAttempt,
    JobsRecord,
    Lease,
    ManifestEntry,
    PartRef,
    PlanRecord,
    PrepareError,
    PrepareRecord,
    SpecDocument,
    WorkerAssignment,
    WorkerJobs,
    WorkerState,
    read_jobs,
    read_manifest,
    read_marker,
    read_plan,
    update_jobs,
)
from orchestrator.core.records.serve import (
    FINAL_BATCH_STATUSES,
    BatchCounts,
    BatchDocument,
    BatchRequestError,
    BatchStatus,
    BatchTokens,
    FilePurpose,
    IdempotencyRecord,
    StoredFile,
    read_batch,
    read_file_record,
)
from orchestrator.core.records.zones import (
    ZoneHistory,
    ZoneTally,
    ZoneWatch,
    read_zone_history,
    update_zone_history,
)

__all__ = [
    "CAS_ATTEMPTS",
    "FINAL_BATCH_STATUSES",
    "AdapterFile",
    "AdapterManifest",
    "AnswerIndex",
    "BatchCounts",
    "BatchDocument",
    "BatchRequestError",
    "BatchStatus",
    "BatchTokens",
    "CancelRecord",
    "ChunkStats",
    "DecisionRecord",
    "Document",
    "DoneMarker",
    "FilePurpose",
    "Heartbeat",
    "HeartbeatSummary",
    "IdempotencyRecord",
    "IndexPart",
    "JobAttempt",
    "JobsRecord",
    "KeyRecord",
    "Lease",
    "ManifestEntry",
    "PartRef",
    "PlanRecord",
    "PrepareError",
    "PrepareRecord",
    "Record",
    "ReuseRecord",
    "ReuseSource",
    "SpecDocument",
    "StoredFile",
    "WorkerAssignment",
    "WorkerJobs",
    "WorkerState",
    "ZoneHistory",
    "ZoneTally",
    "ZoneWatch",
    "cas_update",
    "dumps",
    "iter_jsonl",
    "parse_record",
    "read_batch",
    "read_file_record",
    "read_jobs",
    "read_jsonl",
    "read_manifest",
    "read_marker",
    "read_plan",
    "read_record",
    "read_zone_history",
    "update_jobs",
    "update_zone_history",
    "write_jsonl",
]

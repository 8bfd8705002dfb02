"""In-chunk checkpoints: resume skips flushed rows, overlaps are dropped, the marker is written once."""

from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.checkpoints import ChunkJob, IncompleteChunk, RowStat, load_resume_point
from orchestrator.core.protocol.leases import LeaseKeeper, LeaseLost, acquire
from orchestrator.core.records import DoneMarker
from orchestrator.core.store import open_store
from orchestrator.core.store.memory import MemoryStore

L = RunLayout("r")


class JsonCodec:
    ext = "jsonl"

    def encode(self, rows):
        return b"".join(json.dumps(dataclasses.asdict(r)).encode() + b"\n" for r in rows)

    def decode(self, data):
        return [RowStat(**json.loads(line)) for line in data.splitlines()]


def rows(indices, error_every=0):
    return [RowStat(i, bool(error_every and i % error_every == 0), 10, 5) for i in indices]


@pytest.fixture(params=["memory", "local"])
def store(request, tmp_path):
    return MemoryStore() if request.param == "memory" else open_store(tmp_path)


def start(store, holder="h0", worker="0", now=0.0, chunk_rows=10):
    clock = lambda: now  # noqa: E731
    held = acquire(store, L, "c1", worker=worker, holder=holder, ttl=60, now=now)
    assert held is not None
    job = ChunkJob(
        store, L, LeaseKeeper(store, L, held, ttl=60, clock=clock), JsonCodec(), clock, chunk_rows=chunk_rows
    )
    job.resume()
    return job


def finish(job):
    return job.complete(worker="0", model="m", spec_hash="s", accelerator="cpu")


def test_chunk_job_writes_parts_then_one_marker_listing_them(store):
    job = start(store)
    job.checkpoint(rows(range(4)))
    job.checkpoint(rows(range(4, 10), error_every=5))
    marker = finish(job)
    assert marker is not None and marker.rows == 10 and marker.errors == 1
    assert [p.rows for p in marker.parts] == [4, 6]
    stored = DoneMarker.model_validate_json(store.get(L.done("c1")).data)
    assert [p.key for p in stored.parts] == [p.key for p in marker.parts]
    assert marker.tokens_in == 100 and marker.tokens_out == 50
    assert store.head(L.lease("c1")) is None  # the marker supersedes the lease
    assert len(list(store.list(L.stats_prefix))) == 1


def test_chunk_job_resume_skips_flushed_rows(store):
    first = start(store, holder="h0")
    first.checkpoint(rows(range(6)))
    # The first worker dies; a second one takes the expired lease and resumes.
    second = start(store, holder="h1", worker="1", now=1000.0)
    assert second.point.done_rows == set(range(6))
    second.checkpoint(rows(range(6, 10)))
    marker = finish(second)
    assert sorted(p.key.rsplit("/", 1)[1].split("-")[0] for p in marker.parts) == ["h0", "h1"]
    assert marker.rows == 10


def test_chunk_job_resume_drops_overlapping_late_part(store):
    """A zombie flushed after losing its lease: its part overlaps the new holder's and is dropped."""
    zombie = start(store, holder="h0")
    zombie.checkpoint(rows(range(3)))
    new = start(store, holder="h1", worker="1", now=1000.0)
    new.checkpoint(rows(range(3, 7)))
    # The zombie's next flush fails its renewal: nothing is written.
    with pytest.raises(LeaseLost):
        zombie.checkpoint(rows(range(3, 5)))
    # Simulate the race where the zombie's part landed anyway (renewed just before losing the lease).
    store.put(L.output_part("c1", "h0", 2), JsonCodec().encode(rows(range(5, 9))))
    third = start(store, holder="h2", worker="2", now=3000.0)
    assert third.point.done_rows == set(range(7))
    assert third.point.dropped == [L.output_part("c1", "h0", 2)]
    third.checkpoint(rows(range(7, 10)))
    marker = finish(third)
    listed = [p.key for p in marker.parts]
    assert L.output_part("c1", "h0", 2) not in listed
    covered = []
    for key in listed:
        covered += [r.index for r in JsonCodec().decode(store.get(key).data)]
    assert sorted(covered) == list(range(10))


def test_chunk_job_never_reuses_its_own_part_names(store):
    job = start(store, holder="h0")
    job.checkpoint(rows(range(2)))
    again = start(store, holder="h0", now=1.0)  # the same holder comes back to the chunk
    again.checkpoint(rows(range(2, 4)))
    assert len(list(store.list(L.outputs_prefix("c1")))) == 2


def test_chunk_job_refuses_marker_for_missing_rows(store):
    job = start(store)
    job.checkpoint(rows(range(9)))
    with pytest.raises(IncompleteChunk):
        finish(job)
    assert store.head(L.done("c1")) is None


def test_chunk_job_refuses_a_row_twice(store):
    job = start(store)
    job.checkpoint(rows(range(3)))
    with pytest.raises(IncompleteChunk):
        job.checkpoint(rows(range(2, 4)))


def test_chunk_job_second_finisher_writes_no_marker(store):
    a = start(store, holder="h0")
    a.checkpoint(rows(range(10)))
    assert finish(a) is not None
    # A worker that (wrongly) still holds a lease object cannot overwrite the marker.
    b = start(store, holder="h1", worker="1", now=1.0)
    assert b.point.done_rows == set(range(10))
    assert finish(b) is None
    assert DoneMarker.model_validate_json(store.get(L.done("c1")).data).holder == "h0"


def test_resume_point_of_untouched_chunk_is_empty(store):
    point = load_resume_point(store, L, "c9", JsonCodec())
    assert point.parts == [] and point.done_rows == set()

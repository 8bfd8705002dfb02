"""Key names: records packed into keys survive the trip, stay short, and list in time order."""

from __future__ import annotations

import pytest

from orchestrator.core.layout import RunLayout, chunk_id, decode_key_record, encode_key_record
from orchestrator.core.records import ChunkStats, Heartbeat, HeartbeatSummary

L = RunLayout("run-1")


def test_key_record_round_trips_awkward_values():
    values = ["NVIDIA A100-SXM4-80GB", None, True, 12.5, "a!b/c%d e", 0]
    fields = ("a", "b", "c", "d", "e", "f")
    decoded = decode_key_record(encode_key_record(values), fields)
    assert decoded == {"a": "NVIDIA A100-SXM4-80GB", "b": None, "c": "1", "d": "12.5", "e": "a!b/c%d e", "f": "0"}
    assert "/" not in encode_key_record(values)


def test_heartbeat_summary_fits_a_file_name_and_round_trips():
    hb = Heartbeat(
        worker="123r1",
        holder="123r1.0123456789",
        state="running",
        chunk="part_000042",
        chunk_rows=100000,
        chunk_rows_done=54321,
        chunks_done=99,
        rows_done=9999999,
        errors=12345,
        tokens_per_s=12345.678,
        rows_per_s=3.14159,
        accelerator="NVIDIA A100-SXM4-80GB",
        spot=True,
        cloud="kubernetes-long-name",
        region="europe-west4-a-long",
        started_at=1795346762.928,
        updated_at=1795350000.123,
        exit_code=None,
    )
    key = L.heartbeat(hb.worker, hb.summary().key_values())
    component = key.rsplit("/", 1)[1]
    assert len(component.encode()) < 255
    back = HeartbeatSummary.from_key(component)
    assert back.chunk == "part_000042" and back.spot is True and back.rows_per_s == pytest.approx(3.14159, rel=1e-5)
    assert back.updated_at == pytest.approx(1795350000.1, abs=0.1)


def test_stats_keys_list_in_time_order_and_parse_back():
    stats = ChunkStats(
        rows=5000, errors=3, tokens_in=10, tokens_out=20, seconds=3600.5, worker="7", accelerator="L4", tokens_cached=8
    )
    early = L.stats("part_00009", stats.key_values(), 1000.0)
    late = L.stats("part_00001", stats.key_values(), 2000.0)
    assert early < late  # time first, chunk second
    finished, chunk, encoded = L.parse_stats(late)
    assert (finished, chunk) == (2000.0, "part_00001")
    assert ChunkStats.from_key(encoded) == stats
    assert L.stats_since(2000.0) < late and L.stats_since(2000.001) > late


def test_key_record_of_another_shape_is_refused():
    with pytest.raises(ValueError):
        HeartbeatSummary.from_key("v0!x!y")
    with pytest.raises(ValueError):
        ChunkStats.from_key("v1!" + "!".join(["1"] * 20))


def test_key_record_written_before_fields_were_appended_still_reads():
    stats = ChunkStats(rows=1, errors=0, tokens_in=2, tokens_out=3, seconds=4.0, worker="w", accelerator=None)
    older = encode_key_record(stats.key_values()[:-1])  # as written before `accelerator` existed
    assert ChunkStats.from_key(older) == stats


def test_chunk_ids_sort_in_chunk_order():
    ids = [chunk_id(i, 200_000) for i in (0, 9, 10, 199_999)]
    assert ids == sorted(ids) and ids[0] == "part_000000"

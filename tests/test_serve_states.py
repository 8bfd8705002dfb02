"""A served batch's moves: one table, and each transition's outcome (applied, already there, not allowed)."""

from __future__ import annotations

import typing

import pytest

from orchestrator.core.records import FINAL_BATCH_STATUSES, BatchDocument, BatchStatus, read_batch
from orchestrator.core.store import open_store
from orchestrator.serve.batch_states import EXPIRING, FAILING, LAYOUT, MOVES, Outcome, state_of, transition


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))


def new_batch(store, batch_id="batch_1") -> str:
    doc = BatchDocument(
        id=batch_id,
        owner="o",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        created_at=1,
        created_ms=1000,
        expires_at=100,
    )
    store.put(LAYOUT.batch(batch_id), doc.to_bytes())
    return batch_id


def test_batch_states_table_reaches_every_status_and_leaves_no_final_one():
    statuses = set(typing.get_args(BatchStatus))
    targets = {to for _, to in MOVES}
    assert statuses - {"validating"} <= targets  # every status but the first is reached by some move
    assert not [move for move in MOVES if move[0] in FINAL_BATCH_STATUSES]
    assert {EXPIRING, FAILING} <= targets


def test_batch_transition_applies_stamps_and_writes_its_changes(store):
    batch_id = new_batch(store)
    moved = transition(store, batch_id, "in_progress", now=5, changes={"model": "m"})
    assert moved.outcome is Outcome.APPLIED
    stored = read_batch(store, LAYOUT, batch_id)
    assert stored.status == "in_progress" and stored.in_progress_at == 5 and stored.model == "m"


def test_batch_transition_taken_again_is_already_there_and_writes_nothing(store):
    batch_id = new_batch(store)
    transition(store, batch_id, "cancelling", now=5)
    again = transition(store, batch_id, "cancelling", now=9)
    assert again.outcome is Outcome.ALREADY and again.outcome.there
    assert read_batch(store, LAYOUT, batch_id).cancelling_at == 5


def test_batch_transition_outside_the_table_is_refused_and_changes_nothing(store):
    batch_id = new_batch(store)
    refused = transition(store, batch_id, "completed", now=5)  # validating -> completed: no such move
    assert refused.outcome is Outcome.NOT_ALLOWED and not refused.outcome.there
    assert read_batch(store, LAYOUT, batch_id).status == "validating"


def test_batch_decided_end_reads_in_progress_until_it_is_written(store):
    batch_id = new_batch(store)
    transition(store, batch_id, "in_progress", now=2)
    decided = transition(store, batch_id, EXPIRING, now=3)
    assert decided.outcome is Outcome.APPLIED
    assert decided.batch.status == "in_progress" and state_of(decided.batch) == EXPIRING
    # Decided ends exclude the other moves: a cancel now is refused, the end goes on.
    assert transition(store, batch_id, "cancelling", now=4).outcome is Outcome.NOT_ALLOWED
    ended = transition(store, batch_id, "expired", now=6, changes={"output_file_id": "file-x"})
    assert ended.outcome is Outcome.APPLIED
    final = read_batch(store, LAYOUT, batch_id)
    assert (final.status, final.ending, final.expired_at, final.output_file_id) == ("expired", None, 6, "file-x")
    assert all(transition(store, batch_id, to, now=7).outcome is Outcome.NOT_ALLOWED for to in ("cancelling", FAILING))

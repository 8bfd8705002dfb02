"""Chunks whose holder died: crashes counted on takeover, in-flight notes, suspects, poison rows."""

from __future__ import annotations

import pytest

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.crashes import CAREFUL_GROUP, QUICK_DEATH_S, careful_groups, poison_evidence
from orchestrator.core.protocol.leases import LeaseKeeper, LeaseLost, acquire, read_lease
from orchestrator.core.store import open_store
from orchestrator.core.store.memory import MemoryStore

L = RunLayout("r")
TTL = 60.0


@pytest.fixture(params=["memory", "local"])
def store(request, tmp_path):
    return MemoryStore() if request.param == "memory" else open_store(tmp_path)


def hold(store, holder, now, worker=None, **kw):
    """A worker process taking the chunk, with its keeper (clock fixed at `now`)."""
    held = acquire(store, L, "c", worker=worker or holder, holder=holder, ttl=TTL, now=now, **kw)
    assert held is not None, f"{holder} could not take the chunk"
    return LeaseKeeper(store, L, held, ttl=TTL, clock=lambda: now)


def lease(store):
    return read_lease(store, L, "c")[0]


def test_crash_counted_only_when_the_holder_died(store):
    first = hold(store, "a", now=0.0)
    first.release()  # given back (SIGTERM): no crash
    second = hold(store, "b", now=1.0)
    assert second.held.lease.crashes == 0
    # b dies; c takes the expired lease over: one crash.
    third = hold(store, "c", now=1.0 + TTL + 1)
    assert third.held.lease.crashes == 1 and lease(store).crashes == 1
    # The same worker id starting again takes its earlier process's lease: a second crash.
    fourth = hold(store, "c2", now=TTL + 3, worker="c")
    assert fourth.held.lease.crashes == 2


def test_crash_not_counted_for_a_rescue_of_a_live_holder(store):
    hold(store, "slow", now=0.0)
    rescuer = hold(store, "fast", now=1.0, may_take=lambda old: old.holder == "slow")
    assert rescuer.held.lease.crashes == 0


def test_crash_engine_failure_gives_the_chunk_up_as_a_death(store):
    hold(store, "a", now=0.0).release(died=True)
    # Free at once, for anyone, and counted as a crash.
    successor = hold(store, "b", now=1.0)
    assert successor.held.lease.crashes == 1


def test_crash_notes_narrow_down_to_the_row_alone_in_two_quick_deaths(store):
    hold(store, "a", now=0.0)  # dies with no note: not careful yet
    b = hold(store, "b", now=100.0)
    assert b.held.lease.crashes == 1 and b.held.lease.suspects == []
    b.note_in_flight([0, 1, 2])
    b.note_in_flight([3, 4, 5])  # the first group finished; dies with the second in flight
    c = hold(store, "c", now=200.0)
    assert c.held.lease.crashes == 2
    assert c.held.lease.suspects == [3, 4, 5] and c.held.lease.poison == []
    c.note_in_flight([3])  # suspects run alone: 3 finishes
    c.note_in_flight([4])  # ...and 4 kills c at once: one piece of evidence, not yet a verdict
    d = hold(store, "d", now=300.0)
    assert d.held.lease.lone_deaths == {4: ["c"]} and d.held.lease.poison == []
    assert d.held.lease.suspects == [3, 4, 5] and d.held.lease.in_flight is None
    d.note_in_flight([4])  # alone again, in another fresh process, and it dies again at once
    e = hold(store, "e", now=400.0)
    assert e.held.lease.poison == [4] and e.held.lease.suspects == [3, 5]
    assert poison_evidence(e.held.lease, 4) == (
        "row 4 of chunk c was alone in the engine of 2 worker processes (c, d) that each died "
        f"within {QUICK_DEATH_S:g} s (and a heartbeat) of starting it"
    )
    # Poison stays poison whoever holds the chunk next, a death or not.
    e.release()
    assert hold(store, "f", now=401.0).held.lease.poison == [4]


def test_crash_a_row_that_outlived_a_quick_death_is_no_evidence(store):
    hold(store, "a", now=0.0)
    b = hold(store, "b", now=100.0)
    b.note_in_flight([4])
    b.renew_if_due()  # not yet: the row has not run for QUICK_DEATH_S
    assert lease(store).renewed_at == 100.0
    later = LeaseKeeper(store, L, b.held, ttl=TTL, clock=lambda: 100.0 + QUICK_DEATH_S)
    later.renew_if_due()  # the alive mark: 4 outlived a quick death
    # b is killed from outside while 4 runs on: 4 is a suspect (it runs alone), not a culprit.
    c = hold(store, "c", now=300.0)
    assert c.held.lease.suspects == [4] and c.held.lease.lone_deaths == {} and c.held.lease.poison == []


def test_crash_deaths_with_rows_in_company_are_no_evidence(store):
    """Kills from outside while careful groups run (a kill storm): suspects, never poison."""
    hold(store, "a", now=0.0)
    now = 100.0
    for holder in "bcdefg":
        keeper = hold(store, holder, now=now)
        keeper.note_in_flight([7, 8])
        now += 100.0
    successor = hold(store, "h", now=now)
    assert successor.held.lease.crashes == 7 and successor.held.lease.poison == []
    assert successor.held.lease.lone_deaths == {} and successor.held.lease.suspects == [7, 8]


def test_crash_record_survives_a_clean_handover_but_the_note_does_not(store):
    hold(store, "a", now=0.0)
    b = hold(store, "b", now=100.0)
    b.note_in_flight([7])
    b.release()  # SIGTERM while 7 was in flight: 7 did not kill anything
    c = hold(store, "c", now=101.0)
    assert c.held.lease.crashes == 1 and c.held.lease.suspects == [] and c.held.lease.poison == []


def test_crash_note_is_refused_once_the_lease_is_lost(store):
    b = hold(store, "b", now=0.0)
    hold(store, "c", now=TTL + 1)
    with pytest.raises(LeaseLost):
        b.note_in_flight([1])
    assert lease(store).holder == "c" and lease(store).in_flight is None


def test_careful_groups_put_each_suspect_alone_and_keep_order():
    rows = list(range(CAREFUL_GROUP * 2 + 5))
    groups = list(careful_groups(rows, lambda r: r, {3, 40}))
    assert [r for g in groups for r in g] == rows
    assert [3] in groups and [40] in groups
    assert all(len(g) <= CAREFUL_GROUP for g in groups)
    assert groups[0] == [0, 1, 2]


def test_careful_groups_run_rows_with_evidence_last():
    """A row one death names runs after the rest: a kill at the same moment of each process's life
    (seconds after it starts) then falls on another row, not on the same one twice."""
    rows = list(range(40))
    groups = list(careful_groups(rows, lambda r: r, {2, 3, 5}, last={3}))
    assert [r for g in groups for r in g] == [r for r in rows if r != 3] + [3]
    assert groups[:3] == [[0, 1], [2], [4]] and groups[-1] == [3]

"""Leases: create-if-absent to take, compare-and-swap to renew, release and take over."""

from __future__ import annotations

import threading

import pytest

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.leases import LeaseKeeper, LeaseLost, acquire, read_lease, release, renew
from orchestrator.core.store import open_store
from orchestrator.core.store.memory import MemoryStore

L = RunLayout("r")


@pytest.fixture(params=["memory", "local"])
def store(request, tmp_path):
    return MemoryStore() if request.param == "memory" else open_store(tmp_path)


def take(store, chunk="c1", worker="0", holder="h0", now=100.0, ttl=60.0, **kw):
    return acquire(store, L, chunk, worker=worker, holder=holder, ttl=ttl, now=now, **kw)


def test_lease_acquire_free_chunk_then_others_are_refused(store):
    held = take(store)
    assert held is not None and held.lease.expires_at == 160.0
    assert take(store, worker="1", holder="h1", now=110.0) is None
    assert read_lease(store, L, "c1")[0].holder == "h0"


def test_lease_acquire_is_idempotent_for_the_same_holder(store):
    first = take(store)
    again = take(store, now=120.0)
    assert again is not None and again.lease.holder == "h0" and again.etag == first.etag


def test_lease_expired_is_taken_over_and_old_holder_loses_it(store):
    old = take(store)
    new = take(store, worker="1", holder="h1", now=161.0)
    assert new is not None and new.lease.holder == "h1"
    with pytest.raises(LeaseLost) as lost:
        renew(store, L, old, ttl=60, now=162.0)
    assert lost.value.by == "h1"


def test_lease_renewal_extends_and_keeps_others_out(store):
    held = take(store)
    held = renew(store, L, held, ttl=60, now=150.0)
    assert held.lease.expires_at == 210.0
    assert take(store, worker="1", holder="h1", now=170.0) is None


def test_lease_same_worker_takes_over_its_previous_process(store):
    take(store, worker="3", holder="old-process")
    held = take(store, worker="3", holder="new-process", now=101.0)
    assert held is not None and held.lease.holder == "new-process"


def test_lease_released_chunk_is_free_at_once(store):
    held = take(store)
    release(store, L, held, now=101.0)
    assert take(store, worker="1", holder="h1", now=102.0) is not None


def test_lease_release_after_losing_it_changes_nothing(store):
    old = take(store)
    take(store, worker="1", holder="h1", now=161.0)
    release(store, L, old, now=162.0)
    lease = read_lease(store, L, "c1")[0]
    assert lease.holder == "h1" and not lease.released


def test_lease_may_take_lets_a_rescuer_take_a_live_lease(store):
    take(store, worker="slow", holder="hs")
    assert take(store, worker="fast", holder="hf", now=101.0, may_take=lambda lease: lease.holder == "other") is None
    held = take(store, worker="fast", holder="hf", now=101.0, may_take=lambda lease: lease.holder == "hs")
    assert held is not None and held.lease.holder == "hf"


def test_lease_keeper_serialises_renewals_and_remembers_loss(store):
    now = [100.0]
    keeper = LeaseKeeper(store, L, take(store), ttl=60, clock=lambda: now[0])
    errors = []

    def renewer():
        for _ in range(20):
            try:
                keeper.renew()
            except LeaseLost as e:
                errors.append(e)

    threads = [threading.Thread(target=renewer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []  # 80 renewals from 4 threads, none mistaken for a loss
    now[0] = 500.0
    take(store, worker="1", holder="h1", now=500.0)
    with pytest.raises(LeaseLost):
        keeper.renew()
    assert keeper.lost is not None
    with pytest.raises(LeaseLost):
        keeper.renew_if_due()


def test_lease_race_for_a_free_chunk_has_one_winner(store):
    winners, barrier = [], threading.Barrier(8)

    def racer(i):
        barrier.wait()
        if take(store, chunk="hot", worker=str(i), holder=f"h{i}") is not None:
            winners.append(i)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_lease_race_for_an_expired_chunk_has_one_winner(store):
    take(store, chunk="stale", worker="dead", holder="hd", now=0.0)
    winners, barrier = [], threading.Barrier(8)

    def racer(i):
        barrier.wait()
        if take(store, chunk="stale", worker=str(i), holder=f"h{i}", now=1000.0) is not None:
            winners.append(i)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1

"""Claims: own list first, then untouched chunks of the busiest worker (tail first), then expired, then rescue."""

from __future__ import annotations

import random

from orchestrator.protocol.claims import ChunkClaimer, RescuePolicy, RunSnapshot, pick_rescue, steal_order, take_snapshot
from orchestrator.protocol.heartbeats import HeartbeatPublisher, read_heartbeats
from orchestrator.protocol.layout import RunLayout
from orchestrator.protocol.leases import acquire
from orchestrator.protocol.records import Heartbeat, PlanRecord, WorkerAssignment
from orchestrator.store.memory import MemoryStore

L = RunLayout("r")


def plan(lists):
    return PlanRecord(
        workers=[WorkerAssignment(worker=i, chunks=c, rows=len(c), est_tokens=len(c)) for i, c in enumerate(lists)],
        chunks=sum(len(c) for c in lists), rows=0, est_tokens=0, created_at=0,
    )  # fmt: skip


PLAN = plan([["a0", "a1", "a2"], ["b0", "b1", "b2", "b3", "b4"], ["c0", "c1"]])
WORK = {c: 1.0 for a in PLAN.workers for c in a.chunks}


def claimer(store, worker, own, now=100.0, **kw):
    return ChunkClaimer(
        store=store, layout=L, worker=str(worker), holder=f"h{worker}", plan=PLAN, work=WORK,
        ttl=60, clock=lambda: now, own=own, rng=random.Random(0), **kw,
    )  # fmt: skip


def test_claim_takes_own_list_in_order():
    store = MemoryStore()
    c = claimer(store, 0, own=0)
    assert [c.next_chunk().chunk for _ in range(3)] == ["a0", "a1", "a2"]


def test_claim_skips_done_and_held_chunks_of_own_list():
    store = MemoryStore()
    store.put(L.done("a0"), b"{}")
    acquire(store, L, "a1", worker="9", holder="h9", ttl=60, now=99.0)
    assert claimer(store, 0, own=0).next_chunk().chunk == "a2"


def test_claim_steals_tail_of_busiest_worker_after_own_list():
    store = MemoryStore()
    for chunk in ["c0", "c1"]:
        store.put(L.done(chunk), b"{}")
    c = claimer(store, 2, own=2)
    assert c.next_chunk().chunk == "b4"  # worker 1 has most untouched work; its last chunk first
    # b4 is ours now, so worker 1 still has the most untouched work: its new tail is next.
    assert c.next_chunk().chunk == "b3"


def test_steal_order_round_robin_tails_then_stale_leases():
    snap = RunSnapshot(done=frozenset({"c0", "c1"}), lease_written={"b0": 99.0, "a0": 10.0})
    order = steal_order(snap, PLAN, WORK, own=2, now=100.0, ttl=60, rng=random.Random(1))
    assert order[:2] == ["b4", "a2"]
    assert set(order[:6]) == {"b4", "b3", "b2", "b1", "a2", "a1"}
    assert order[-1] == "a0"  # a lease last written 90 s ago with a 60 s TTL: probably expired
    assert "b0" not in order  # renewed a second ago: alive


def test_claim_takes_over_an_expired_lease():
    store = MemoryStore(clock=lambda: 0.0)
    for a in PLAN.workers:
        for chunk in a.chunks:
            if chunk != "b2":
                store.put(L.done(chunk), b"{}")
    acquire(store, L, "b2", worker="1", holder="dead", ttl=60, now=0.0)
    held = claimer(store, 0, own=0, now=1000.0).next_chunk()
    assert held is not None and held.chunk == "b2" and held.lease.holder == "h0"


def test_claim_returns_none_when_everything_is_done_or_held():
    store = MemoryStore()
    for a in PLAN.workers:
        for chunk in a.chunks:
            acquire(store, L, chunk, worker="x", holder="hx", ttl=600, now=100.0)
    assert claimer(store, 0, own=0).next_chunk() is None


def heartbeat(worker, chunk, rows, done, rate, updated=100.0, state="running"):
    return {"worker": worker, "holder": f"h{worker}", "state": state, "chunk": chunk,
            "chunk_rows": rows, "chunk_rows_done": done, "rows_per_s": rate, "updated_at": updated}  # fmt: skip


def test_rescue_picks_the_slow_worker_we_beat_most():
    beats = {
        "1": heartbeat("1", "b0", 5000, 1000, 1.0),  # 4000 s left; we'd need 1000+30
        "2": heartbeat("2", "c0", 5000, 4800, 1.0),  # 200 s left: not worth it
        "3": heartbeat("3", "a0", 5000, 1000, 3.0),  # 1333 s left; we'd need 1030: not 2x faster
    }
    pick = pick_rescue(beats, our_worker="0", our_rows_per_s=4.0, now=100.0, policy=RescuePolicy())
    assert pick is not None and (pick.chunk, pick.holder) == ("b0", "h1")


def test_rescue_ignores_stale_heartbeats_and_idle_workers():
    beats = {
        "1": heartbeat("1", "b0", 5000, 0, 1.0, updated=-1000.0),
        "2": heartbeat("2", "c0", 5000, 0, 1.0, state="idle"),
    }
    assert pick_rescue(beats, our_worker="0", our_rows_per_s=4.0, now=100.0, policy=RescuePolicy()) is None


def test_claim_rescues_a_live_chunk_from_a_much_slower_worker():
    store = MemoryStore(clock=lambda: 100.0)
    for a in PLAN.workers:
        for chunk in a.chunks:
            if chunk != "b1":
                store.put(L.done(chunk), b"{}")
    acquire(store, L, "b1", worker="1", holder="h1", ttl=600, now=100.0)
    HeartbeatPublisher(store, L, Heartbeat(worker="1", holder="h1", state="running", started_at=0, updated_at=0)).publish(
        chunk="b1", chunk_rows=5000, chunk_rows_done=500, rows_per_s=1.0, updated_at=100.0
    )
    slow_claimer = claimer(store, 0, own=0)
    assert slow_claimer.next_chunk() is None  # no speed of our own yet: no rescue
    fast = claimer(store, 0, own=0, rows_per_s=lambda: 5.0)
    held = fast.next_chunk()
    assert held is not None and held.chunk == "b1" and held.lease.holder == "h0"


def test_heartbeats_listing_keeps_the_newest_per_worker():
    store = MemoryStore()
    pub = HeartbeatPublisher(store, L, Heartbeat(worker="7", holder="h7", state="starting", started_at=1, updated_at=1))
    pub.publish(state="running", chunk="a0", updated_at=2)
    pub.publish(state="running", chunk="a1", updated_at=3)
    assert len(list(store.list(L.heartbeats_prefix))) == 1
    # A new process of the same worker removes the old process's key on its first publish.
    pub2 = HeartbeatPublisher(store, L, Heartbeat(worker="7", holder="h7b", state="starting", started_at=4, updated_at=4))
    pub2.publish(updated_at=5)
    beats = read_heartbeats(store, L)
    assert list(beats) == ["7"] and beats["7"]["holder"] == "h7b"
    store.requests.reset()
    read_heartbeats(store, L)
    assert store.requests.total == 1


def test_snapshot_reads_only_listings():
    store = MemoryStore()
    store.put(L.done("a0"), b"{}")
    acquire(store, L, "a1", worker="0", holder="h0", ttl=60, now=0.0)
    store.requests.reset()
    snap = take_snapshot(store, L)
    assert snap.done == {"a0"} and set(snap.lease_written) == {"a1"}
    assert store.requests.by_op == {"list": 2}

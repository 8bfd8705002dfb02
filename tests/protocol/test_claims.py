"""Claims: own list first, then untouched tails of the busiest list, then expired leases, then rescue."""

from __future__ import annotations

import random

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.claims import (
    ChunkClaimer,
    PlanIndex,
    RescuePolicy,
    RunView,
    expired_lease_chunks,
    pick_rescue,
)
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher, read_heartbeats
from orchestrator.core.protocol.leases import acquire
from orchestrator.core.records import Heartbeat, HeartbeatSummary, PlanRecord, WorkerAssignment
from orchestrator.core.store.memory import MemoryStore

L = RunLayout("r")


def plan(lists):
    return PlanRecord(
        workers=[WorkerAssignment(worker=i, chunks=c, rows=len(c), est_tokens=len(c)) for i, c in enumerate(lists)],
        chunks=sum(len(c) for c in lists),
        rows=0,
        est_tokens=0,
        created_at=0,
    )


PLAN = plan([["a0", "a1", "a2"], ["b0", "b1", "b2", "b3", "b4"], ["c0", "c1"]])
WORK = {c: 1.0 for a in PLAN.workers for c in a.chunks}
INDEX = PlanIndex.build(PLAN, WORK)


def finish(store, chunk, t=1.0):
    """What ChunkJob.complete leaves behind: a marker and a stats entry."""
    store.put(L.done(chunk), b"{}")
    store.put(L.stats(chunk, [1, 0, 0, 0, 1.0, "0", None], t), b"")


def claimer(store, worker, own, now=100.0, view=None, **kw):
    view = view or RunView(store, L, INDEX, rng=random.Random(0))
    return ChunkClaimer(
        store=store,
        layout=L,
        view=view,
        worker=str(worker),
        holder=f"h{worker}",
        ttl=60,
        clock=lambda: now,
        own=own,
        **kw,
    )


def test_claim_takes_own_list_in_order():
    c = claimer(MemoryStore(), 0, own=0)
    assert [c.next_chunk().chunk for _ in range(3)] == ["a0", "a1", "a2"]


def test_claim_skips_finished_and_held_chunks_of_own_list():
    store = MemoryStore()
    finish(store, "a0")
    acquire(store, L, "a1", worker="9", holder="h9", ttl=60, now=99.0)
    assert claimer(store, 0, own=0).next_chunk().chunk == "a2"


def test_claim_steals_the_tail_of_the_busiest_list_after_its_own():
    store = MemoryStore()
    finish(store, "c0")
    finish(store, "c1")
    c = claimer(store, 2, own=2)
    assert c.next_chunk().chunk == "b4"  # list 1 has the most unfinished work; its last chunk first
    assert c.next_chunk().chunk == "b3"  # still the busiest (4 left against 3)
    assert c.next_chunk().chunk in ("a2", "b2")  # now equal: random order between them


def test_claim_without_stealing_stops_after_its_own_list():
    c = claimer(MemoryStore(), 2, own=2, steal=False)
    assert [c.next_chunk().chunk for _ in range(2)] == ["c0", "c1"]
    assert c.next_chunk() is None


def test_claim_learns_finished_chunks_incrementally():
    store = MemoryStore()
    view = RunView(store, L, INDEX, skew_margin_s=0, rng=random.Random(0))
    c = claimer(store, 2, own=2, view=view)
    c.next_chunk(), c.next_chunk()  # c0, c1
    for chunk in ["b1", "b2", "b3", "b4"]:
        finish(store, chunk, t=5.0)
    store.requests.reset()
    assert c.next_chunk().chunk == "a2"  # list 0 has the most unfinished work now
    # One listing of the stats written since the last look, one create-if-absent, and one look
    # for the chunk's marker (a finisher deletes its lease after writing it).
    assert store.requests.by_op == {"list": 1, "put_if_absent": 1, "head": 1}


def test_claim_takes_over_an_expired_lease():
    store = MemoryStore(clock=lambda: 0.0)
    for a in PLAN.workers:
        for chunk in a.chunks:
            if chunk != "b2":
                finish(store, chunk)
    acquire(store, L, "b2", worker="1", holder="dead", ttl=60, now=0.0)
    held = claimer(store, 0, own=0, now=1000.0).next_chunk()
    assert held is not None and held.chunk == "b2" and held.lease.holder == "h0"


def test_claim_never_hands_back_a_chunk_the_caller_is_working_on():
    """A worker claims its next chunk while it holds the current one: even when a listing makes its
    own lease look expired (a late renewal), that chunk is not handed out a second time."""
    store = MemoryStore(clock=lambda: 0.0)  # every object written at t=0
    for a in PLAN.workers:
        for chunk in a.chunks:
            if chunk != "b2":
                finish(store, chunk)
    c = claimer(store, 0, own=None, now=0.0)
    assert c.next_chunk().chunk == "b2"  # ours now; its lease was written at t=0
    later = claimer(store, 0, own=None, now=1000.0)  # the same holder, when the listing says "stale"
    assert later.next_chunk().chunk == "b2"  # what acquire does for a holder asking again...
    assert later.next_chunk(working_on={"b2"}) is None  # ...and what a worker that holds it gets


def test_expired_lease_chunks_are_oldest_first_and_unfinished():
    times = iter([10.0, 50.0, 95.0])
    store = MemoryStore(clock=lambda: next(times))
    for chunk in ["b1", "a0", "c1"]:
        acquire(store, L, chunk, worker="x", holder="hx", ttl=60, now=0.0)
    view = RunView(store, L, INDEX)
    assert expired_lease_chunks(store, L, view, now=100.0, ttl=30) == ["b1", "a0"]


def test_claim_returns_none_when_everything_is_done_or_held():
    store = MemoryStore()
    for a in PLAN.workers:
        for chunk in a.chunks:
            acquire(store, L, chunk, worker="x", holder="hx", ttl=600, now=100.0)
    assert claimer(store, 0, own=0).next_chunk() is None


def test_claimers_sharing_a_view_never_get_the_same_chunk():
    store = MemoryStore()
    view = RunView(store, L, INDEX, rng=random.Random(3))
    claimers = [claimer(store, w, own=None, view=view) for w in range(4)]
    got = []
    while True:
        held = [c.next_chunk() for c in claimers]
        got += [h.chunk for h in held if h is not None]
        if all(h is None for h in held):
            break
    assert sorted(got) == sorted(WORK)


def test_plan_index_gives_chunks_outside_the_plan_to_anyone():
    index = PlanIndex.build(PLAN, {**WORK, "z9": 1.0})
    assert index.owner["z9"] == -1
    store = MemoryStore()
    view = RunView(store, L, index, rng=random.Random(0))
    assert "z9" in list(view.untouched(exclude=None))


def heartbeat(worker, chunk, rows, done, rate, updated=100.0, state="running"):
    return HeartbeatSummary(
        holder=f"h{worker}",
        state=state,
        chunk=chunk,
        chunk_rows=rows,
        chunk_rows_done=done,
        rows_per_s=rate,
        started_at=0.0,
        updated_at=updated,
    )


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
                finish(store, chunk)
    acquire(store, L, "b1", worker="1", holder="h1", ttl=600, now=100.0)
    HeartbeatPublisher(
        store, L, Heartbeat(worker="1", holder="h1", state="running", started_at=0, updated_at=0)
    ).publish(chunk="b1", chunk_rows=5000, chunk_rows_done=500, rows_per_s=1.0, updated_at=100.0)
    assert claimer(store, 0, own=0).next_chunk() is None  # no speed of our own yet: no rescue
    held = claimer(store, 0, own=0, rows_per_s=lambda: 5.0).next_chunk()
    assert held is not None and held.chunk == "b1" and held.lease.holder == "h0"


def test_heartbeats_listing_keeps_the_newest_per_worker():
    store = MemoryStore()
    pub = HeartbeatPublisher(store, L, Heartbeat(worker="7", holder="h7", state="starting", started_at=1, updated_at=1))
    pub.publish(state="running", chunk="a0", updated_at=2)
    pub.publish(state="running", chunk="a1", updated_at=3)
    assert len(list(store.list(L.heartbeats_prefix))) == 1
    # A new process of the same worker removes the old process's key on its first publish.
    pub2 = HeartbeatPublisher(
        store, L, Heartbeat(worker="7", holder="h7b", state="starting", started_at=4, updated_at=4)
    )
    pub2.publish(updated_at=5)
    beats = read_heartbeats(store, L)
    assert list(beats) == ["7"] and beats["7"].holder == "h7b"
    store.requests.reset()
    read_heartbeats(store, L)
    assert store.requests.total == 1


def test_heartbeat_carries_uptime_over_restarts():
    store = MemoryStore()
    first = HeartbeatPublisher(
        store, L, Heartbeat(worker="3", holder="a", state="running", started_at=100, updated_at=100)
    )
    first.publish(updated_at=400)
    second = HeartbeatPublisher(
        store, L, Heartbeat(worker="3", holder="b", state="starting", started_at=1000, updated_at=1000)
    )
    beat = second.publish(updated_at=1100)
    assert beat.uptime_before_s == 300 and beat.uptime_s == 400
    assert read_heartbeats(store, L)["3"].uptime_before_s == 300


def test_claim_a_restarted_worker_takes_back_its_interrupted_chunk_through_a_shared_view():
    store = MemoryStore()
    view = RunView(store, L, INDEX, rng=random.Random(0))
    first = claimer(store, 0, own=0, view=view)
    assert first.next_chunk().chunk == "a0"  # then the process is preempted
    restarted = ChunkClaimer(
        store=store, layout=L, view=view, worker="0", holder="h0-new", ttl=60, clock=lambda: 101.0, own=0
    )
    held = restarted.next_chunk()
    assert held.chunk == "a0" and held.lease.holder == "h0-new"


def test_a_removed_marker_reopens_its_chunk_at_every_end_game_claim_of_a_process_view():
    store = MemoryStore()
    for a in PLAN.workers:
        for chunk in a.chunks:
            finish(store, chunk)
    c = claimer(store, 0, own=0)
    assert c.next_chunk() is None
    store.delete(L.done("b3"))  # `orch redo` by hand: its stats entry stays
    held = c.next_chunk()
    assert held is not None and held.chunk == "b3"


def test_claimers_sharing_a_view_share_one_listing_of_the_markers_per_interval():
    """A thousand simulated workers each listing every marker at the end of the run cost workers x
    chunks; sharing one view, they list done/ once per `recheck_every_s` of their clock."""
    store = MemoryStore()
    for t, chunk in enumerate(sorted(WORK)):
        finish(store, chunk, t=float(t))
    now = [100.0]
    view = RunView(store, L, INDEX, skew_margin_s=0, recheck_every_s=60, rng=random.Random(0))
    claimers = [
        ChunkClaimer(store=store, layout=L, view=view, worker=str(w), holder=f"h{w}", ttl=60, clock=lambda: now[0])
        for w in range(4)
    ]
    listed = []
    real_list = store.list
    store.list = lambda prefix, start_after=None: listed.append(prefix) or real_list(prefix, start_after)
    assert all(c.next_chunk() is None for c in claimers)
    assert listed.count(L.done_prefix) == 1
    store.delete(L.done("a1"))
    store.delete(L.done("c0"))
    assert claimers[0].next_chunk() is None  # within the interval: not seen yet
    now[0] += 60
    got = [c.next_chunk() for c in claimers[:3]]
    # Both reopened chunks are handed out, each once, though one listing found them.
    assert sorted(h.chunk for h in got if h is not None) == ["a1", "c0"] and got[2] is None


def test_a_thief_prefers_chunks_sharing_a_prompt_prefix_it_has_served():
    """Chunks prepared with --group-by-prefix: c1 and a1 share prefix "p"; once worker 2 took c1,
    it steals a1 (its engine has "p" cached) before the tail of the busiest list."""
    prefixes = {"c1": ["p"], "a1": ["p"], "a2": ["q"], "b4": ["r"]}
    index = PlanIndex.build(PLAN, WORK, prefixes)
    store = MemoryStore()
    finish(store, "c0")
    c = claimer(store, 2, own=2, view=RunView(store, L, index, rng=random.Random(0)))
    assert c.next_chunk().chunk == "c1" and c.served == {"p"}
    assert c.next_chunk().chunk == "a1"  # affine, though list 1 is the busiest
    assert c.next_chunk().chunk == "b4"  # nothing affine left open: the busiest tail
    # A chunk with a served prefix that someone holds is not taken.
    other = claimer(store, 0, own=None, view=RunView(store, L, index, rng=random.Random(0)))
    other.served.add("q")
    acquire(store, L, "a2", worker="9", holder="h9", ttl=60, now=99.0)
    assert other.next_chunk().chunk != "a2"

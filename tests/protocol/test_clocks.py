"""Leases judged by the store's clock: a live holder on a clock that differs is never taken over, and the skew is reported."""

from __future__ import annotations

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.claims import PlanIndex, RunView, expired_lease_chunks
from orchestrator.core.protocol.clocks import StoreClock
from orchestrator.core.protocol.heartbeats import HeartbeatPublisher
from orchestrator.core.protocol.leases import LeaseKeeper, acquire, read_lease
from orchestrator.core.records import Heartbeat, PlanRecord, WorkerAssignment
from orchestrator.core.store.memory import MemoryStore

L = RunLayout("r")
TTL = 60.0


class World:
    """A store on the true time, and workers whose clocks are off it by fixed offsets."""

    def __init__(self) -> None:
        self.t = 1_000.0
        self.store = MemoryStore(clock=lambda: self.t)
        self.notes: list[str] = []

    def clock(self, offset: float):
        return lambda: self.t + offset

    def store_clock(self, offset: float) -> StoreClock:
        """A worker's StoreClock, measured as the worker measures it (a heartbeat written and read back)."""
        clock = StoreClock(self.clock(offset), report=self.notes.append)
        beat = Heartbeat(worker="w", holder=f"w.{offset}", state="starting", started_at=self.t, updated_at=self.t)
        HeartbeatPublisher(self.store, L, beat, clock).publish()
        return clock

    def take(self, holder: str, offset: float, store_clock: StoreClock | None):
        return acquire(
            self.store, L, "c", worker=holder, holder=holder, ttl=TTL, now=self.t + offset, store_clock=store_clock
        )


def test_store_clock_measures_the_offset_from_a_heartbeat_written():
    world = World()
    ahead = world.store_clock(120.0)
    assert ahead.offset_s is not None and abs(ahead.offset_s - 120.0) < 1.0
    assert abs(ahead.now() - world.t) < 1.0
    assert world.notes == ["this worker's clock is 120 s ahead of the store's; leases are judged by the store's "
                           "clock, but fix the clock (NTP)"]  # fmt: skip
    assert abs(world.store_clock(0.0).offset_s or 0.0) < 1.0 and len(world.notes) == 1  # in time: nothing said
    slow = StoreClock(world.clock(0.0))
    slow.observe(before=world.t, after=world.t + 5.0, modified=world.t)  # a write this slow measures nothing
    assert slow.offset_s is None


def test_lease_of_a_live_holder_is_not_taken_by_a_worker_whose_clock_runs_ahead():
    """The ping-pong: a reader 120 s ahead sees every live lease as expired (TTL 60, renewed every 20 s)."""
    world = World()
    held = world.take("normal", 0.0, world.store_clock(0.0))
    keeper = LeaseKeeper(world.store, L, held, ttl=TTL, clock=world.clock(0.0))
    ahead = world.store_clock(120.0)
    for _ in range(6):  # two minutes of renewals every 20 s: never taken
        world.t += TTL / 3
        keeper.renew_if_due()
        assert world.take("ahead", 120.0, ahead) is None
        assert expired_lease_chunks_now(world, ahead.now()) == []
    assert read_lease(world.store, L, "c")[0].holder == "normal" and keeper.lost is None
    # Without the store's clock (the old rule) the lease would have gone: the test sees the skew.
    assert world.take("ahead", 120.0, None) is not None


def test_lease_of_a_live_holder_whose_clock_runs_behind_is_not_taken_and_its_skew_is_named():
    world = World()
    behind = world.take("late", -120.0, world.store_clock(-120.0))
    assert behind is not None
    world.notes.clear()
    world.t += 5.0
    assert world.take("normal", 0.0, world.store_clock(0.0)) is None
    assert world.notes == ["worker late (late)'s clock is 120 s behind the store's; leases are judged by the "
                           "store's clock, but fix the clock (NTP)"]  # fmt: skip


def test_lease_of_a_dead_holder_is_taken_once_the_store_saw_no_write_for_a_ttl():
    world = World()
    world.take("dead", -120.0, world.store_clock(-120.0))  # killed at once
    ahead = world.store_clock(120.0)
    world.t += TTL - 1
    assert world.take("ahead", 120.0, ahead) is None
    world.t += 2
    taken = world.take("ahead", 120.0, ahead)
    assert taken is not None and taken.lease.crashes == 1


def expired_lease_chunks_now(world: World, store_now: float) -> list[str]:
    plan = PlanRecord(
        workers=[WorkerAssignment(worker=0, chunks=["c"], rows=1, est_tokens=1)],
        chunks=1,
        rows=1,
        est_tokens=1,
        created_at=0.0,
    )
    view = RunView(world.store, L, PlanIndex.build(plan, {"c": 1.0}))
    return expired_lease_chunks(world.store, L, view, now=store_now, ttl=TTL)

"""Rows that kill their worker: blamed only on evidence that they kill an engine, kept on the lease, answered once.

A row can kill the worker process that generates it (an engine bug, a crash in a kernel). Retried
as usual, it would kill every holder of its chunk, and the chunk would never finish. But most
deaths are not a row's doing: a SIGKILL from outside, a preemption, the machine out of memory. So
a death makes the next holder careful, and only a death with one row alone in the engine, soon
after it started, is evidence against that row; two such deaths, in two processes, make it poison.
The chunk's lease (records.Lease) carries the record, at no cost while no holder dies:

1. A holder dies: its lease is taken over without having been released. That is the store saying
   nobody wrote it for a TTL (by the store's clock: a live holder on a clock that runs behind, or a
   reader's that runs ahead, is never taken for dead; clocks.py), the same worker id starting
   again, or the holder marking it `gave_up` when its engine raised. The successor's lease has
   `crashes + 1`. A lease given back (SIGTERM, a store error, a model that cannot load) or taken
   from a live, slower holder (a rescue) is no death, and no evidence.
2. A chunk that crashed is worked carefully: nothing else is in the engine with it, and before
   handing a group of rows to the engine the holder writes their indices into its lease
   (`in_flight`, with `noted_at`: one compare-and-swap per group). Groups are `CAREFUL_GROUP`
   rows, and every suspect row (below) is a group of its own. A group still in flight
   QUICK_DEATH_S after it was noted is marked alive: the holder renews the lease at its next
   heartbeat (`renewed_at` then passes `noted_at + QUICK_DEATH_S`).
3. A careful holder dies: the rows of its note become `suspects` (they were in flight during a
   death: from now on each runs alone). If the note named one row, and the lease was not marked
   alive (the death came within about QUICK_DEATH_S of the row starting, alone in the engine),
   the dead holder is evidence against that row (`lone_deaths`). A row with evidence runs last,
   after the rest of the chunk: deaths that come at the same moment of every process's life (a
   kill storm, a crash while warming up) then fall on different rows, while a poison row kills
   wherever it runs.
4. A row with evidence from POISON_DEATHS holders (each a fresh process, started after the death
   before) becomes `poison`: every later holder answers it with a `worker_crashed` error row that
   names this evidence, instead of running it; the rest of the chunk completes.

So a row that kills every process it runs in costs four deaths (the first, unexplained; the
careful holder's, with the row in a group; two with the row alone), and the fifth holder answers
it. A healthy row is blamed only if two kills from outside each landed within seconds of it
starting alone in the engine, in two processes: a random kill lands there twice almost never,
and a takeover, a given-back lease or a clock that is off never counts. A row that kills its
engine only after running alone for longer than QUICK_DEATH_S is not caught: its chunk fails its
workers until their retries are spent (`workers.retries`), which `orch watch` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TypeVar

from orchestrator.core.records import Lease

#: Rows handed to the engine at once on a chunk that crashed: few enough that the rows in flight
#: at a death narrow down quickly, enough to keep a careful chunk moving.
CAREFUL_GROUP = 32
#: Seconds within which a death is evidence against the row alone in the engine (step 3): a row
#: that kills its engine does so in its first steps; healthy rows outlive it or finish first.
QUICK_DEATH_S = 30.0
#: Holders that must die with a row alone in the engine before it is poison (step 4).
POISON_DEATHS = 2

T = TypeVar("T")


def inherit(old: Lease, new: Lease, *, died: bool) -> Lease:
    """The successor's lease: the crash record carried over; when `old`'s holder died, one more
    crash, its note's rows made suspects, and the evidence its death gives (steps 3-4)."""
    if not died:
        return new.model_copy(update={k: getattr(old, k) for k in ("crashes", "suspects", "lone_deaths", "poison")})
    lone = {row: list(holders) for row, holders in old.lone_deaths.items()}
    row = lone_death(old)
    if row is not None and old.holder not in lone.setdefault(row, []):
        lone[row].append(old.holder)
    poison = set(old.poison) | {r for r, holders in lone.items() if len(holders) >= POISON_DEATHS}
    suspects = (set(old.suspects) | set(old.in_flight or ())) - poison
    return new.model_copy(
        update={"crashes": old.crashes + 1, "suspects": sorted(suspects), "lone_deaths": lone, "poison": sorted(poison)}
    )


def lone_death(lease: Lease) -> int | None:
    """The row `lease`'s holder had alone in the engine when it died, if it died within
    QUICK_DEATH_S of starting it (the lease was not marked alive since the note)."""
    if lease.in_flight is None or len(lease.in_flight) != 1 or lease.noted_at is None:
        return None
    return lease.in_flight[0] if lease.renewed_at - lease.noted_at < QUICK_DEATH_S else None


def alive_mark_due(lease: Lease, now: float) -> bool:
    """The noted group has been in flight for QUICK_DEATH_S without the lease saying so (step 2)."""
    if lease.in_flight is None or lease.noted_at is None:
        return False
    return lease.renewed_at - lease.noted_at < QUICK_DEATH_S <= now - lease.noted_at


def poison_evidence(lease: Lease, row: int) -> str:
    """Why `row` is poison, in words, for its error row."""
    holders = lease.lone_deaths.get(row, [])
    return (
        f"row {row} of chunk {lease.chunk} was alone in the engine of {len(holders)} worker processes "
        f"({', '.join(holders)}) that each died within {QUICK_DEATH_S:g} s (and a heartbeat) of starting it"
    )


def careful_groups(
    items: Iterable[T], index: Callable[[T], int], suspects: Collection[int], last: Collection[int] = ()
) -> Iterator[list[T]]:
    """Items in the groups a careful holder hands to the engine (step 2): each suspect alone, the
    others `CAREFUL_GROUP` at a time, in order; rows with evidence against them (`last`) alone
    after all others (step 3)."""
    group: list[T] = []
    deferred: list[T] = []
    for item in items:
        if index(item) in last:
            deferred.append(item)
            continue
        if index(item) in suspects:
            if group:
                yield group
                group = []
            yield [item]
            continue
        group.append(item)
        if len(group) == CAREFUL_GROUP:
            yield group
            group = []
    if group:
        yield group
    for item in deferred:
        yield [item]

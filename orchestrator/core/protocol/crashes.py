"""Rows that kill their worker: find them with notes kept only on chunks whose holder died, and answer them once.

A row can kill the worker process that generates it (an engine bug, a crash in a kernel). Retried
as usual, it would kill every holder of its chunk, and the chunk would never finish. The chunk's
lease (records.Lease) carries what the next holders need, at no cost while no holder dies:

1. A holder dies: its lease is taken over without having been released (it expired, or the same
   worker id started again). That is one crash of the chunk: the successor's lease has
   `crashes + 1`. A lease given back (SIGTERM, a store error, a model that cannot load) or taken
   from a live, slower holder (a rescue) is no crash. A worker whose engine raises marks its
   leases as crashed (`LeaseKeeper.release(died=True)`) instead of giving them back.
2. A chunk that crashed is worked carefully: nothing else is in the engine with it, and before
   handing a group of rows to the engine the holder writes their indices into its lease
   (`in_flight`, one compare-and-swap per group). Groups are `CAREFUL_GROUP` rows, and every
   suspect row (below) is a group of its own.
3. A careful holder dies: its note names the rows in flight at that death. A row that was a
   suspect already was in flight, alone, during a second death: it becomes `poison`. The other
   rows of the note become `suspects` (they were in flight during one death).
4. Every later holder answers poison rows with a `worker_crashed` error row instead of running
   them; the rest of the chunk completes.

So a row that kills every process it runs in costs three deaths (the first, unexplained; the
careful holder's, with the row in a group; the one with the row alone), and the fourth holder
answers it. A healthy row is never marked poison unless two deaths happened while it was being
generated, the last one with it alone in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TypeVar

from orchestrator.core.records import Lease

#: Rows handed to the engine at once on a chunk that crashed: few enough that the rows in flight
#: at a death narrow down quickly, enough to keep a careful chunk moving.
CAREFUL_GROUP = 32

T = TypeVar("T")


def inherit(old: Lease, new: Lease, *, died: bool) -> Lease:
    """The successor's lease: the crash record carried over, and one more crash when `old`'s holder died."""
    if not died:
        return new.model_copy(update={"crashes": old.crashes, "suspects": old.suspects, "poison": old.poison})
    seen = set(old.in_flight or ())
    poison = set(old.poison) | (seen & set(old.suspects))
    suspects = (set(old.suspects) | seen) - poison
    return new.model_copy(update={"crashes": old.crashes + 1, "suspects": sorted(suspects), "poison": sorted(poison)})


def careful_groups(items: Iterable[T], index: Callable[[T], int], suspects: Collection[int]) -> Iterator[list[T]]:
    """Items in the groups a careful holder hands to the engine (step 2): each suspect alone, the
    others `CAREFUL_GROUP` at a time, in order."""
    group: list[T] = []
    for item in items:
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

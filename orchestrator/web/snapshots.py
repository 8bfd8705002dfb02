"""Each run's latest status, read at most once per `max_age` however many pages and scrapers ask.

A request answers from memory: the first one for a run waits for its status to be read (`gather`:
at most ~30 store requests, whatever the run's size); a later one that finds the last reading
older than `max_age` starts one reading in the background and waits for it at most WAIT_S: a
small run's page is fresh, a large run's answers at once with the reading before. So a page
answers in milliseconds on a run of 10,000 chunks, and ten open tabs cost the store what one does.

A reading that fails after an earlier one succeeded leaves the earlier one in place, with what went
wrong (`Snapshot.problem`): the views say they show an old reading and why, never pass it off as
fresh; the next request tries again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from orchestrator.runview.status import RunStatus

T = TypeVar("T")

#: Runs kept in memory (the least recently asked for goes first).
KEEP_RUNS = 64
#: How long a request waits for a reading it started before answering with the last one.
WAIT_S = 0.1


@dataclass(frozen=True)
class Snapshot:
    status: RunStatus
    #: Wall-clock time its facts were read.
    taken_at: float
    #: Why the latest reading failed, when this one is older than it (None: this is the latest).
    problem: str | None = None
    #: What was made of this reading (the page, its HTML), kept as long as the reading.
    made: dict[str, Any] = field(default_factory=dict, compare=False)

    def view(self, name: str, make: Callable[[Snapshot], T]) -> T:
        """`make(self)`, once per reading (two requests at once may both make it: the same result)."""
        if name not in self.made:
            self.made[name] = make(self)
        made: T = self.made[name]
        return made


class Snapshots:
    """`get(run)`: the run's status, no older than `max_age` plus one reading's time."""

    def __init__(
        self,
        read: Callable[[str], RunStatus],
        max_age: float,
        *,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.time,
    ):
        self.read = read
        self.max_age = max_age
        self.wait_s = wait_s
        self.clock = clock
        self._lock = threading.Lock()
        self._taken: OrderedDict[str, Snapshot] = OrderedDict()
        self._reading: dict[str, threading.Event] = {}
        self._failed: dict[str, Exception] = {}

    def get(self, run: str) -> Snapshot:
        with self._lock:
            held = self._taken.get(run)
            if held is not None:
                self._taken.move_to_end(run)
            if held is not None and self.clock() - held.taken_at <= self.max_age:
                return held
            reading = self._reading.get(run)
            if reading is None:  # this request starts the run's one reading
                reading = self._reading[run] = threading.Event()
                threading.Thread(target=self._take, args=(run, reading), name=f"orch-status-{run}", daemon=True).start()
        # The first reading is waited for; a later one for at most wait_s, then the last one stands.
        reading.wait(None if held is None else self.wait_s)
        with self._lock:
            fresh = self._taken.get(run)
            failed = self._failed.pop(run, None) if fresh is None else None
        if fresh is None:
            raise failed if failed is not None else RuntimeError(f"no status of run {run} was read")
        return fresh

    def _take(self, run: str, reading: threading.Event) -> None:
        taken_at = self.clock()
        try:
            snap = Snapshot(self.read(run), taken_at)
        except Exception as e:  # the first reading's error goes to its request; later ones keep the last, said
            with self._lock:
                held = self._taken.get(run)
                if held is None:
                    self._failed[run] = e
                else:
                    self._taken[run] = replace(held, problem=f"{type(e).__name__}: {e}", made={})
                self._reading.pop(run, None)
            reading.set()
            return
        with self._lock:
            self._taken[run] = snap
            self._failed.pop(run, None)
            self._taken.move_to_end(run)
            while len(self._taken) > KEEP_RUNS:
                self._taken.popitem(last=False)
            self._reading.pop(run, None)
        reading.set()

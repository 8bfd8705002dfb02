"""Our clock against the store's: measured from an object we just wrote, so lease expiry is judged on one clock.

A lease says until when it holds by its writer's clock (`expires_at`), and a reader compares that
with its own. Two machines whose clocks differ by more than a third of the TTL then disagree on
which leases are alive, and a worker with a clock running ahead would take over live leases (and
lose its own the same way). The store has one clock for everybody: it stamps each object it
writes (S3's LastModified, a file's mtime). So:

1. After writing its heartbeat, a worker reads the object's modification time back: our clock
   minus the store's, at that moment, is our offset (`StoreClock.observe`; kept only when the
   write was quick, so the write's own latency does not pass for skew).
2. A lease is dead only when the store says nobody wrote it for a TTL, by the store's clock
   (`StoreClock.now()`: ours, less the offset). A lease that looks expired by our clock but was
   renewed lately by the store's is alive: never taken over (leases.acquire).
3. Offsets beyond SKEW_WARN_S are reported: a worker logs its own, the heartbeat carries it to
   `orch status`, and a worker that meets a peer's lease renewed on a different clock logs the
   peer's (`renewed_at`, by the peer's clock, against the object's time, by the store's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

#: An offset (seconds) from which a clock is reported as off: above NTP's error and the store's
#: one-second timestamps, well below any lease TTL.
SKEW_WARN_S = 5.0
#: A write slower than this (seconds) measures nothing: its latency would pass for skew.
MAX_WRITE_S = 2.0
#: Seconds between two measures (one HEAD of the heartbeat just written).
MEASURE_EVERY_S = 30.0


def describe_offset(offset: float) -> str:
    """`120 s ahead of` / `3 s behind`: how a clock stands against the store's."""
    return f"{abs(offset):.0f} s {'ahead of' if offset > 0 else 'behind'}"


@dataclass
class StoreClock:
    """Our estimate of the store's clock, and the clock offsets we saw (ours, and peers' through their leases)."""

    clock: Callable[[], float]
    #: Our clock minus the store's (seconds); None until measured (taken as 0 meanwhile).
    offset_s: float | None = None
    #: Called with a line to log when an offset beyond SKEW_WARN_S is first seen (or changes by as much).
    report: Callable[[str], None] | None = None
    _reported: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        """The store's time now, as far as we know."""
        return self.clock() - (self.offset_s or 0.0)

    def observe(self, before: float, after: float, modified: float) -> None:
        """An object we started writing at `before` and finished at `after` (our clock) carries the
        store's time `modified`. S3 stamps whole seconds: the stamp is up to 1 s before the write."""
        if after - before > MAX_WRITE_S:
            return
        resolution = 0.5 if modified == int(modified) else 0.0
        self.offset_s = (before + after) / 2 - (modified + resolution)
        self._note("us", self.offset_s, f"this worker's clock is {describe_offset(self.offset_s)} the store's")

    def peer(self, worker: str, holder: str, renewed_at: float, modified: float) -> float:
        """A lease `holder` (of `worker`) renewed at `renewed_at` by its clock, stored at `modified`:
        its offset, reported when beyond SKEW_WARN_S. Returns it."""
        offset = renewed_at - modified
        self._note(
            f"peer {worker}", offset, f"worker {worker} ({holder})'s clock is {describe_offset(offset)} the store's"
        )
        return offset

    def _note(self, who: str, offset: float, line: str) -> None:
        with self._lock:
            last = self._reported.get(who)
            if abs(offset) < SKEW_WARN_S and last is None:
                return
            if last is not None and abs(offset - last) < SKEW_WARN_S:
                return
            self._reported[who] = offset
        if self.report is not None:
            if abs(offset) < SKEW_WARN_S:
                line += " again (within the tolerance)"
            else:
                line += "; leases are judged by the store's clock, but fix the clock (NTP)"
            self.report(line)

"""Riding out a store that does not answer: since when, when to try again, and when to give up.

A worker or `orch watch` that meets `StoreUnavailable` (no answer after the client's own retries,
a full disk, a lock held too long) does not stop. It keeps what is finished, tries again after a
pause that doubles up to MAX_PAUSE_S (with jitter, so a fleet does not knock in step), and gives
up only when the store has been unreachable for its whole budget: a worker then exits with
WorkerExit.STORE_UNREACHABLE, which the controller (and SkyPilot's `recover_on_exit_codes`) treats as
"start it again", never as a failed worker.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

# The worker imports OutageTooLong from here, beside the outage it ends.
from orchestrator.core.errors import OutageTooLong as OutageTooLong
from orchestrator.core.store import StoreError

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0


class Outage:
    """One process's view of its store's availability; shared by its threads."""

    def __init__(
        self,
        budget_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        first_pause_s: float = FIRST_PAUSE_S,
        max_pause_s: float = MAX_PAUSE_S,
    ):
        self.budget_s = budget_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.first_pause_s = first_pause_s
        self.max_pause_s = max_pause_s
        self.since: float | None = None
        self.error: str | None = None
        self._failures = 0
        self._next_try = 0.0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, error: StoreError) -> bool:
        """Record a failed request. True when it starts an outage (the caller says so once)."""
        with self._lock:
            now = self.clock()
            started = self.since is None
            if started:
                self.since = now
            self.error = str(error)
            self._failures += 1
            # Exponential backoff, half of it random ("equal jitter").
            pause = min(self.max_pause_s, self.first_pause_s * 2 ** (self._failures - 1))
            self._next_try = now + pause / 2 + self.rng.uniform(0, pause / 2)
            return started

    def recovered(self) -> float | None:
        """The store answered. Returns how long it had been unreachable (None if it had not been)."""
        with self._lock:
            if self.since is None:
                return None
            lasted = self.clock() - self.since
            self.since, self.error, self._failures, self._next_try = None, None, 0, 0.0
            return lasted

    def ready(self) -> bool:
        """Time to try the store again (always, when it is not down)."""
        return self.since is None or self.clock() >= self._next_try

    def pause_s(self) -> float:
        """Seconds until the next try, never past the end of the budget."""
        if self.since is None:
            return 0.0
        return max(0.0, min(self._next_try, self.since + self.budget_s) - self.clock())

    def down_for_s(self) -> float:
        return 0.0 if self.since is None else self.clock() - self.since

    def check_budget(self, who: str) -> None:
        """Raise OutageTooLong once the store has been unreachable for the whole budget."""
        if self.since is not None and self.down_for_s() >= self.budget_s:
            raise OutageTooLong(
                f"{who}: the store has not answered for {self.down_for_s():.0f}s (budget {self.budget_s:g}s): "
                f"{self.error}",
                hint="fix the store or the network; store_settings.outage_budget sets how long to wait",
            )

    def describe(self) -> str:
        return f"store unreachable for {self.down_for_s():.0f}s of {self.budget_s:g}s allowed ({self.error})"

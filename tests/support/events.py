"""Waiting for an event, never for a time: a test must pass on a busy machine as on an idle one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How often a wait that reads a run's store looks (`every=`): each look opens a store client and
#: lists or reads it, and looking every 50 ms would take CPU from the workers under test on 2 cores.
STORE_PACE = 0.2


def wait_for(what: str, found: Callable[[], T | None], timeout: float = 600, every: float = 0.05) -> T:
    """The first truthy `found()`, looked for every `every` seconds; `timeout` is only a hang guard,
    and fails saying what never came. Each event is printed with the seconds it took, so a failed
    test's captured output is its timeline."""
    began = time.monotonic()
    while time.monotonic() < began + timeout:
        value = found()
        if value:
            print(f"{time.strftime('%H:%M:%S')} {what}: after {time.monotonic() - began:.1f}s", flush=True)
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")

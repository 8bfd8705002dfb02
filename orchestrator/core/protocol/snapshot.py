"""A run's progress as two listings show it: finished chunks, and when each lease was last written.

For the controller and `status`, which look at the whole run now and then; workers keep an
incremental view instead (claims.RunView).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.core.layout import RunLayout
from orchestrator.core.store import Store


@dataclass(frozen=True)
class RunSnapshot:
    done: frozenset[str]
    lease_written: Mapping[str, float]


def list_done(store: Store, layout: RunLayout) -> frozenset[str]:
    return frozenset(layout.chunk_of(o.key, layout.done_prefix) for o in store.list(layout.done_prefix))


def take_snapshot(store: Store, layout: RunLayout) -> RunSnapshot:
    leases = {layout.chunk_of(o.key, layout.leases_prefix): o.modified for o in store.list(layout.leases_prefix)}
    return RunSnapshot(list_done(store, layout), leases)

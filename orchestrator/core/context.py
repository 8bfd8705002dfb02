"""Resolving what a command works on: the spec (with what the run already froze) and the store."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.frozen_spec import freeze_spec, read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.pools import spec_for_pool
from orchestrator.core.protocol.heartbeats import is_beating, read_heartbeats
from orchestrator.core.spec import RunSpec
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import Store, open_store


@dataclass
class RunContext:
    spec: RunSpec
    store: Store
    layout: RunLayout
    #: Frozen fields changed because nothing was produced with their old values: said to the user.
    notes: list[str] = field(default_factory=list)

    def freeze(self, *, write: bool = True) -> None:
        """Check the spec against the run's frozen fields and record it (`write=False`: check only)."""
        self.spec = freeze_spec(
            self.store,
            self.layout,
            self.spec,
            unlocked=lambda: unlocked_fields(self.store, self.layout, self.spec),
            notes=self.notes,
            write=write,
        )

    def for_pool(self, pool: str | None) -> RunContext:
        """What a worker of `pool` works in: its model as the run's model, its machines as the run's
        resources (core/pools.spec_for_pool); None (a run of one model) is the context itself."""
        return self if pool is None else RunContext(spec_for_pool(self.spec, pool), self.store, self.layout)


def resolve_spec(
    spec_file: str | None, flags: Mapping[str, Any], *, freeze: bool = False, check: bool = False
) -> RunContext:
    """1. Read file, environment and flags to learn the run and the store.
    2. Layer the spec frozen into that run (if any) beneath them and resolve again.
    3. With `freeze`, check the frozen fields and record the spec in the run; with `check`, only
       check them (a command that records the spec once it has succeeded: prepare).
    """
    first = load_spec(spec_file, flags)
    layout = first.layout
    store = open_store(first.store, first.store_settings)
    stored = read_stored_spec(store, layout)
    # The store we opened is where the run lives, whatever the stored copy says.
    spec = load_spec(spec_file, {**flags, "store": first.store}, stored=stored[0] if stored else None)
    ctx = RunContext(spec, store, layout)
    if freeze or check:
        ctx.freeze(write=freeze)
    return ctx


def unlocked_fields(store: Store, layout: RunLayout, spec: RunSpec, now: float | None = None) -> set[str]:
    """Frozen field groups nothing was produced with yet: a command may still change them.

    1. `input`, `chunking` and `reuse`, while the run is not prepared (no prepare record: a prepare
       that failed left nothing behind that was made with them).
    2. `model`, `sampling` and `requests`, while no chunk has outputs (parts or markers) and no worker ever
       loaded the model (its heartbeat says so) or is starting right now.
    """
    unlocked = set()
    if store.head(layout.prepare_record) is None:
        unlocked |= {"input", "chunking", "reuse"}
    produced = any(True for _ in store.list(layout.done_prefix)) or any(True for _ in store.list(layout.outputs_root))
    if not produced:
        now = time.time() if now is None else now
        interval = spec.workers.heartbeat_interval
        engaged = any(
            hb.loaded or is_beating(hb, now=now, heartbeat_interval=interval)
            for hb in read_heartbeats(store, layout).values()
        )
        if not engaged:
            unlocked |= {"model", "sampling", "requests"}
    return unlocked

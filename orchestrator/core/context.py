"""Resolving what a command works on: the spec (with what the run already froze) and the store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.spec import RunSpec, freeze_spec, load_spec, read_stored_spec
from orchestrator.core.store import Store, open_store


@dataclass
class RunContext:
    spec: RunSpec
    store: Store
    layout: RunLayout


def resolve_spec(spec_file: str | None, flags: Mapping[str, Any], *, freeze: bool = False) -> RunContext:
    """1. Read file, environment and flags to learn the run and the store.
    2. Layer the spec frozen into that run (if any) beneath them and resolve again.
    3. With `freeze`, check the frozen fields and record the spec in the run.
    """
    first = load_spec(spec_file, flags)
    layout = first.layout
    store = open_store(first.store, first.store_settings)
    stored = read_stored_spec(store, layout)
    # The store we opened is where the run lives, whatever the stored copy says.
    spec = load_spec(spec_file, {**flags, "store": first.store}, stored=stored[0] if stored else None)
    if freeze:
        spec = freeze_spec(store, layout, spec)
    return RunContext(spec, store, layout)

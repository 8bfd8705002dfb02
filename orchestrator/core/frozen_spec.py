"""A run's frozen spec: the fields that decide its outputs, recorded once in the store, and the check
that a later command does not change them (a null is filled by the first command that sets it).

The spec's JSON schema (`input.response_format`'s) is stored beside it, once, as
`runs/<run>/schemas/<sha256>.json`, and spec.yaml holds its reference (core/request/json_schema.py): a
YAML reader takes seconds over a schema of a few hundred KB, which every command reading the spec
would pay. Written before spec.yaml, read back (its digest checked) with it: a reader gets the
spec whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from orchestrator.core.chat_template import with_templates_read
from orchestrator.core.errors import CorruptRecord, SpecConflict
from orchestrator.core.layout import RunLayout
from orchestrator.core.records import SpecDocument, cas_update, read_record
from orchestrator.core.request.json_schema import (
    RunSchemas,
    json_schema_of,
    referenced,
    referenced_digest,
    schema_digest,
    schema_text,
    with_schema,
)
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import NotFound, Store

#: The fields that decide what a run's outputs are. A null in the frozen spec is filled by the
#: first command that sets it (a model named at launch, chunking at prepare); a value is final.
FROZEN_FIELDS: tuple[str, ...] = (
    "model.name",
    "model.dtype",
    "model.max_model_len",
    "model.chat_template",
    "model.runner",
    "model.tool_parser",
    "model.reasoning_parser",
    "model.lora",
    "models",
    "sweep",
    "sampling",
    "requests",
    "input",
    "chunking",
    "reuse",
)

#: The fields of a `models:` entry that say where its workers run (core/pools.OPERATIONAL_FIELDS):
#: free to change, like the run's own workers and resources.
MODEL_OPERATIONAL_FIELDS = ("workers", "resources")

#: Frozen groups compared as a whole: `num_chunks: 200` then `rows_per_chunk: 100` is one change;
#: `--reuse-from a` then `--reuse-from b` another.
_ATOMIC_FIELDS = {"chunking", "reuse"}


def frozen_view(spec: RunSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json")
    view = {path: _get(data, path) for path in FROZEN_FIELDS}
    view["models"] = {
        name: {k: v for k, v in entry.items() if k not in MODEL_OPERATIONAL_FIELDS}
        for name, entry in view["models"].items()
    }
    if not spec.sweep.cascade:  # no cascade: the hash of a run prepared before cascades existed
        view["sweep"] = {k: v for k, v in view["sweep"].items() if k not in ("cascade", "escalate_when")}
    if not spec.reuse.runs:  # no reuse: the hash of a run prepared before reuse was frozen
        del view["reuse"]
    return view


def spec_hash(spec: RunSpec) -> str:
    """A short hash of the frozen fields: workers stamp it on every marker they write."""
    canonical = json.dumps(frozen_view(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def read_stored_spec(store: Store, layout: RunLayout) -> tuple[dict[str, Any], str] | None:
    """The spec frozen into the run (as a plain mapping, its schema read back) and its ETag, or None for a new run."""
    found = read_record(store, layout.spec, SpecDocument)
    return None if found is None else (with_stored_schema(store, layout, found[0].spec), found[1])


def with_stored_schema(store: Store, layout: RunLayout, spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec mapping with its schema reference replaced by the schema stored beside it."""
    spec_input = spec.get("input") or {}
    response_format = spec_input.get("response_format")
    digest = referenced_digest(json_schema_of(response_format))
    if digest is None:
        return spec
    key = layout.schema(digest)
    try:
        data = store.get(key).data
    except NotFound:
        raise CorruptRecord(
            "the run's JSON schema is missing from the store (spec.yaml names it)",
            where=key,
            hint="the run's store was changed outside orch: prepare the data again under a new --run",
        ) from None
    if schema_digest(data.decode(errors="replace")) != digest:
        raise CorruptRecord(
            "the run's JSON schema does not match its SHA-256 (the store changed under the run)",
            where=key,
            hint="prepare the data again under a new --run",
        )
    schema = json.loads(data)
    return {**spec, "input": {**spec_input, "response_format": with_schema(response_format, schema)}}


def run_schemas(store: Store, layout: RunLayout) -> RunSchemas:
    """The schemas the run's request lines reference (none for a run with no frozen spec or schema)."""
    found = read_stored_spec(store, layout)
    return RunSchemas.of(((found[0].get("input") or {}) if found else {}).get("response_format"))


def stored_schema(spec: RunSpec) -> tuple[str, str] | None:
    """(digest, text) of the spec's JSON schema, as stored beside spec.yaml; None without one."""
    schema = json_schema_of(spec.input.response_format)
    if schema is None:
        return None
    text = schema_text(schema)
    return schema_digest(text), text


def stored_input(spec: RunSpec) -> dict[str, Any]:
    """`spec.input` as spec.yaml holds it: the schema's reference in place of the schema."""
    data = spec.input.model_dump(mode="json")
    return {**data, "response_format": referenced(data["response_format"])}


def freeze_spec(
    store: Store,
    layout: RunLayout,
    spec: RunSpec,
    *,
    unlocked: Callable[[], Collection[str]] | None = None,
    notes: list[str] | None = None,
    write: bool = True,
) -> RunSpec:
    """Record the spec in the run, or check it against what is recorded. Returns the merged spec.

    1. New run: write spec.yaml create-if-absent.
    2. Existing run: every frozen field must be equal, or null on one side (then the set value
       wins and is recorded). Differences are refused, listed field by field, except in the groups
       `unlocked()` names (frozen fields nothing was produced with yet: context.unlocked_fields;
       asked only when a field differs), where the new value wins and a line saying so goes to
       `notes`.
    3. Write back (compare-and-swap) when anything changed; re-checked if another command raced us.
    With `write=False`, only steps 1-2's checks: nothing is recorded.
    """
    merged = spec

    def change(stored: SpecDocument | None) -> SpecDocument | None:
        nonlocal merged
        if stored is None:
            merged = spec
            return _recorded(store, layout, spec) if write else None
        stored_spec = with_stored_schema(store, layout, stored.spec)
        # A run frozen by an older orch may hold a template's path: compared as the file's text.
        old = with_templates_read(RunSpec.model_validate(stored_spec), lenient=True)
        changed: list[str] = []
        merged = _merge_frozen(old, spec, unlocked, changed)
        if notes is not None:
            notes[:] = changed
        if not write or merged.model_dump(mode="json") == stored_spec:
            return None
        return _recorded(store, layout, merged)

    cas_update(store, layout.spec, SpecDocument, change)
    return merged


def _merge_frozen(
    old: RunSpec, new: RunSpec, unlocked: Callable[[], Collection[str]] | None, changed: list[str]
) -> RunSpec:
    old_data, new_data = old.model_dump(mode="json"), new.model_dump(mode="json")
    diffs: list[str] = []
    groups: Collection[str] | None = None
    for path in FROZEN_FIELDS:
        for leaf, before, after in _leaf_diffs(path, _get(old_data, path), _get(new_data, path)):
            if _operational(leaf):
                continue
            if before is None:
                continue  # filled for the first time
            if after is None:
                _set(new_data, leaf, before)
                continue
            if groups is None:
                groups = unlocked() if unlocked is not None else ()
            if any(leaf == group or leaf.startswith(group + ".") for group in groups):
                changed.append(f"{leaf}: {json.dumps(before)} -> {json.dumps(after)}")
                continue
            diffs.append(f"{leaf}: {json.dumps(before)} (frozen) != {json.dumps(after)} (now)")
    if diffs:
        raise SpecConflict(
            f"run {old.run!r} was prepared with a different spec:\n  " + "\n  ".join(diffs),
            hint="start a new run (--run NEW), or put the frozen values back",
        )
    return RunSpec.model_validate(new_data)


def _leaf_diffs(path: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    if path in _ATOMIC_FIELDS:
        if before == after or _all_null(before):
            return []
        return [(path, before, None if _all_null(after) else after)]
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after)):
            out += _leaf_diffs(f"{path}.{key}", before.get(key), after.get(key))
        return out
    return [] if before == after else [(path, before, after)]


def _operational(leaf: str) -> bool:
    """models.<name>.workers / .resources...: where a model's workers run, never frozen."""
    parts = leaf.split(".")
    return len(parts) > 2 and parts[0] == "models" and parts[2] in MODEL_OPERATIONAL_FIELDS


def _all_null(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


def _recorded(store: Store, layout: RunLayout, spec: RunSpec) -> SpecDocument:
    """spec.yaml's document for `spec`, its schema stored first (the same bytes under the same
    name, whoever writes them: no condition needed)."""
    schema = stored_schema(spec)
    if schema is not None:
        store.put(layout.schema(schema[0]), schema[1].encode())
    return spec_document(spec)


def spec_document(spec: RunSpec) -> SpecDocument:
    """spec.yaml's document: the spec, its schema referenced, and the hash of its frozen fields."""
    return SpecDocument(spec_hash=spec_hash(spec), spec={**spec.model_dump(mode="json"), "input": stored_input(spec)})


def _get(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value

"""What a prepare was made from, by content, and how an input differs from it.

A file is its name, size and content digest (not its path or mtime: the same data found from
elsewhere, or touched, is the same input); a table is its id, pinned version and columns
(prepare/table_sources/tables.py). Collect's kept columns check the input against the same record.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.frozen_spec import stored_input
from orchestrator.core.spec import RunSpec
from orchestrator.prepare.source_file import TABLE_KINDS, SourceFile
from orchestrator.prepare.sources import content_digest


def input_identity(spec: RunSpec, files: list[SourceFile]) -> dict[str, Any]:
    """What a prepare was made from: each file's content (name, size, digest; not its path or
    mtime, so the same data found from elsewhere, or touched, is the same input); a table's id,
    version and columns; the input mapping and the chunking."""
    from orchestrator.prepare.table_sources.tables import table_identity

    return {
        "sources": [
            {
                "uri": f.uri,
                "name": f.name,
                "size": f.size,
                "digest": content_digest(f),
                **(table_identity(f) if f.kind in TABLE_KINDS else {}),
            }
            for f in files
        ],
        "input": stored_input(spec),  # the schema by its reference, as spec.yaml holds it
        "chunking": spec.chunking.model_dump(mode="json"),
    }


def input_differences(identity: dict[str, Any], files: list[SourceFile]) -> list[str]:
    """How the files now differ from those recorded, file by file (content, not paths)."""
    before = identity.get("sources", [])
    out = []
    if len(before) != len(files):
        out.append(f"{len(before)} file(s) then ({_names(before)}), {len(files)} now ({_names(files)})")
    for then, now in zip(before, files, strict=False):
        name = then.get("name") or str(then.get("uri", "?")).rsplit("/", 1)[-1]
        if now.kind in TABLE_KINDS:
            from orchestrator.prepare.table_sources.tables import table_differences

            out.extend(table_differences(then, now))
        elif then.get("size") != now.size:
            out.append(f"{now.uri}: {now.size:,} bytes, {then.get('size', 0):,} when prepared (as {name})")
        elif "digest" not in then:
            continue  # recorded by an orch that kept no digest: the size is all there is to compare
        elif then["digest"] != content_digest(now):
            out.append(f"{now.uri}: same size ({now.size:,} bytes) as {name} when prepared, different content")
    return out


def _names(files: list[Any]) -> str:
    names = [f.name if isinstance(f, SourceFile) else f.get("name") or f.get("uri", "?") for f in files]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

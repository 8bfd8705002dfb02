"""A table source or sink as written (its kind, location, version) and the settings that reach it on S3.

The forms are listed in tables.py and docs/tables.md.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator.core.errors import InputError

#: Versions listed when the one asked for does not exist.
LATEST_SHOWN = 5
_VERSION = re.compile(r"@(\d+)$")
_PREFIXES = {"iceberg://": "iceberg", "delta:": "delta", "lance:": "lance", "hf://": "hf", "hf:": "hf"}


@dataclass(frozen=True)
class TableRef:
    """A table source as written: its kind, where it is, the version asked for (None: the latest)."""

    kind: str  # iceberg | delta | lance | hf
    location: str  # a path or URI; for Iceberg the table's name, NAMESPACE.TABLE
    version: str | None = None
    catalog: str = ""  # Iceberg: the catalog's name
    properties: dict[str, str] = field(default_factory=dict)  # Iceberg: the catalog's properties
    split: str | None = None  # a saved DatasetDict's split


def table_kind(source: str) -> str | None:
    """The kind of table a source names (by its prefix, or what its directory holds), else None."""
    for prefix, kind in _PREFIXES.items():
        if source.startswith(prefix):
            return kind
    if source.startswith(("s3://", "r2://")):
        return None
    path = Path(_VERSION.sub("", source.split("#", 1)[0]).removeprefix("file://"))
    if path.is_dir():
        if (path / "_delta_log").is_dir():
            return "delta"
        if (path / "_versions").is_dir():
            return "lance"
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "hf"
    return "hf" if path.suffix == ".arrow" and path.is_file() else None


def parse_table(source: str) -> TableRef:
    """The source's parts; InputError for a form that is not one of the module's."""
    kind = table_kind(source)
    if kind is None:
        raise InputError(f"{source}: not a table source", where=source)
    if kind == "iceberg":
        parts = urlsplit(source)
        name, version = split_version(parts.path.lstrip("/"))
        if not parts.netloc or "." not in name:
            raise InputError(
                f"{source}: an Iceberg source is iceberg://CATALOG/NAMESPACE.TABLE[@SNAPSHOT]", where=source
            )
        return TableRef(kind, name, version, parts.netloc, dict(parse_qsl(parts.query)))
    if source.startswith("hf://"):
        return TableRef(kind, source)  # the hub's paths carry their revision (@REV) themselves
    location = source.removeprefix(f"{kind}:") if source.startswith(f"{kind}:") else source
    location, _, split = location.partition("#")
    location, version = split_version(location)
    return TableRef(kind, location.removeprefix("file://"), version, split=split or None)


def split_version(text: str) -> tuple[str, str | None]:
    found = _VERSION.search(text)
    return (text[: found.start()], found.group(1)) if found else (text, None)


def no_version(source: str, word: str, asked: str, latest: list[str]) -> InputError:
    return InputError(
        f"no {word} {asked} in the table (the latest: {', '.join(latest) or 'none'})",
        where=source,
        hint=f"name one of its {word}s after @, or leave @{asked} out to read the latest",
    )


def when_utc(milliseconds: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(milliseconds / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def same_columns(source: str, since: str, then: Any, now: Any, columns: list[str] | None) -> None:
    names = columns or [f.name for f in now]
    changed = [n for n in names if n not in then.names or n not in now.names or then.field(n).type != now.field(n).type]
    if changed:
        raise InputError(
            f"the schema changed since {since}: column(s) {', '.join(changed)} differ "
            f"(then: {', '.join(f'{f.name}: {f.type}' for f in then)})",
            where=source,
            hint="read the whole table (no incremental read across a schema change)",
        )


def s3_settings(kind: str, location: str) -> dict[str, str]:
    """What the table's library needs, beyond its own reading of the environment, to reach a table
    on S3: the endpoint (ORCH_S3_ENDPOINT_URL, then AWS_ENDPOINT_URL: the store's own order, so one
    setting points the store and the tables at the same server), plain HTTP when that endpoint is
    http://, and the region (AWS_REGION, AWS_DEFAULT_REGION). Credentials stay with each library's
    own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, instance roles). Empty for a
    local table, or when nothing is set."""
    if kind != "iceberg" and not location.startswith("s3://"):
        return {}
    endpoint = os.environ.get("ORCH_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    plain_http = "true" if (endpoint or "").startswith("http://") else None
    names = {
        "delta": ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ALLOW_HTTP"),
        "lance": ("aws_endpoint", "aws_region", "allow_http"),
        "iceberg": ("s3.endpoint", "s3.region", None),  # pyarrow's S3 reads http:// endpoints as given
    }[kind]
    values = (endpoint, region, plain_http)
    return {name: value for name, value in zip(names, values, strict=True) if name and value}

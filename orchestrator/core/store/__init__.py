"""Run stores: where everything a run knows lives. `open_store(uri)` picks the backend from the URI."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.errors import (
    InvalidKey,
    NotFound,
    PreconditionFailed,
    StoreBusy,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from orchestrator.core.store.base import (
    Blob,
    ObjectInfo,
    RequestCounter,
    Store,
    StoreSettings,
    ignore_stray,
)

__all__ = [
    "Blob",
    "InvalidKey",
    "NotFound",
    "ObjectInfo",
    "PreconditionFailed",
    "RequestCounter",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoreSettings",
    "StoreUnavailable",
    "ignore_stray",
    "open_store",
]


def open_store(uri: str | Path, settings: StoreSettings | None = None, *, worker: bool = False) -> Store:
    """A plain path or `file://` is a local directory; `s3://` and `r2://` go through boto3.

    `settings` (the spec's store_settings) bound every wait; `worker` picks the workers' longer
    per-request timeouts and retries instead of the interactive ones."""
    text = str(uri)
    settings = settings or StoreSettings()
    if text.startswith(("s3://", "r2://")):
        from orchestrator.core.store.s3 import from_uri

        return from_uri(text, settings, worker=worker)
    if "://" in text and not text.startswith("file://"):
        raise StoreError(
            f"unsupported store URI {text!r}",
            hint="use a directory, file://PATH, s3://BUCKET/PREFIX or r2://BUCKET/PREFIX",
        )
    from orchestrator.core.store.local import LocalStore

    return LocalStore(text.removeprefix("file://"), lock_timeout=settings.lock_timeout)

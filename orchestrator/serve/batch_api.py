"""What the Batches endpoints ask of the store: create (once per Idempotency-Key), get, list, cancel."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from orchestrator.core.records import BatchDocument, IdempotencyRecord, cas_update, read_batch, read_record
from orchestrator.prepare.formats import URLS, runner_of
from orchestrator.serve.batch_states import LAYOUT, Outcome, transition
from orchestrator.serve.errors import APIError, not_found
from orchestrator.serve.files import owned_file, valid_id
from orchestrator.serve.settings import ServeSettings

log = logging.getLogger("orch.serve")

#: The endpoints a batch may name: those orch's workers answer, generating or pooling (embeddings,
#: score, rerank); a served model of that runner must be there too.
ENDPOINTS = tuple(url for urls in URLS.values() for url in urls)
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512


class BatchAPI:
    """The batches of one store as the API sees them; the driver (driver.py) moves them along."""

    def __init__(self, settings: ServeSettings, clock: Callable[[], float] = time.time):
        self.settings = settings
        self.store = settings.store
        self.clock = clock

    def create(
        self,
        owner: str,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        idempotency_key: str | None = None,
    ) -> BatchDocument:
        """Check the request (400s, as OpenAI answers them), then record the batch as `validating`:
        its document, then its active entry (the driver takes it from there), then its owner's index.

        With an Idempotency-Key the owner already sent with the same request, the batch that request
        made is returned instead (as it is now): a retry after a timeout or a 5xx starts nothing twice.
        """
        request = _request_hash(input_file_id, endpoint, completion_window, metadata)
        claim_key = LAYOUT.idempotency(owner, _key_hash(idempotency_key)) if idempotency_key is not None else None
        if claim_key is not None:
            found = read_record(self.store, claim_key, IdempotencyRecord)
            earlier = self._replay(found[0], request) if found is not None else None
            if earlier is not None:
                return earlier
        window = self._check_request(owner, input_file_id, endpoint, completion_window, metadata)
        batch_id, now_ms = f"batch_{uuid.uuid4().hex[:24]}", int(self.clock() * 1000)
        if claim_key is not None:
            # Claimed before the batch exists: of two requests racing with one key, one claim stands,
            # and both go on with its id and time, so both write (or find) the same batch.
            mine = IdempotencyRecord(owner=owner, request=request, batch_id=batch_id, created_ms=now_ms)
            claim, _ = cas_update(
                self.store, claim_key, IdempotencyRecord, lambda old: mine if old is None else None, expect_new=True
            )
            assert claim is not None  # ours, or the one already there
            _check_same_request(claim, request)
            batch_id, now_ms = claim.batch_id, claim.created_ms
        batch = BatchDocument(
            id=batch_id,
            owner=owner,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            metadata=metadata,
            created_at=now_ms // 1000,
            created_ms=now_ms,
            expires_at=int(now_ms / 1000 + window),
        )
        created = self._record(batch)
        log.info("%s: created (%s, window %s)", batch.id, endpoint, completion_window)
        return created

    def _check_request(
        self, owner: str, input_file_id: str, endpoint: str, completion_window: str, metadata: dict[str, str] | None
    ) -> float:
        """A batch request's fields, refused as OpenAI refuses them (400, 404); the window's seconds."""
        if endpoint not in ENDPOINTS:
            raise APIError(
                400,
                f"Invalid value for 'endpoint': {endpoint!r}. Supported values are: {_quoted(ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        runner = runner_of(endpoint)
        if runner not in self.settings.runners.values():
            served = ", ".join(f"{name} ({r})" for name, r in sorted(self.settings.runners.items()))
            raise APIError(
                400,
                f"No model served here supports {endpoint!r}: it needs a model with model.runner {runner}, and "
                f"this server serves {served}.",
                param="endpoint",
                code="invalid_value",
            )
        window = self.settings.windows.get(completion_window)
        if window is None:
            raise APIError(
                400,
                f"Invalid value for 'completion_window': {completion_window!r}. "
                f"Supported values are: {_quoted(self.settings.windows)}.",
                param="completion_window",
                code="invalid_value",
            )
        _check_metadata(metadata)
        source = owned_file(self.store, owner, input_file_id)
        if source is None:
            raise not_found("File", input_file_id)
        if source.purpose != "batch":
            raise APIError(400, "The input file must be a file uploaded with purpose 'batch'.", param="input_file_id")
        return window

    def _record(self, batch: BatchDocument) -> BatchDocument:
        """Write the batch unless it exists (then it stands, as it is now), then its active entry while
        it is not final, and its owner's index entry: each step safe to take again."""
        stored, _ = cas_update(
            self.store,
            LAYOUT.batch(batch.id),
            BatchDocument,
            lambda old: batch if old is None else None,
            expect_new=True,
        )
        assert stored is not None  # ours, or the one already there
        if not stored.final:
            self.store.put(LAYOUT.active(stored.id), b"")
        self.store.put(LAYOUT.owned(stored.owner, "batches", stored.created_ms, stored.id), b"")
        return stored

    def _replay(self, claim: IdempotencyRecord, request: str) -> BatchDocument | None:
        """The batch an earlier request with the same key made; None when it has not written it yet
        (still under way, or it died): the caller then creates it, under the claim's id and time."""
        _check_same_request(claim, request)
        batch = read_batch(self.store, LAYOUT, claim.batch_id)
        if batch is None:
            return None
        log.info("%s: returned again for a request with the same Idempotency-Key", batch.id)
        return self._record(batch)

    def get(self, owner: str, batch_id: str) -> BatchDocument:
        """The batch, if `owner` owns it: another owner's batch answers 404, as an unknown id does."""
        batch = read_batch(self.store, LAYOUT, batch_id) if valid_id(batch_id) else None
        if batch is None or batch.owner != owner:
            raise not_found("Batch", batch_id)
        return batch

    def page(self, owner: str, *, after: str | None, limit: int) -> tuple[list[BatchDocument], bool]:
        """A page of the owner's batches, newest first, from the owner's index (flat: `start_after` pages it)."""
        start = None
        if after is not None:
            mark = self.get(owner, after)
            start = LAYOUT.owned(owner, "batches", mark.created_ms, mark.id)
        page: list[BatchDocument] = []
        for info in self.store.list(LAYOUT.owned_prefix(owner, "batches"), start_after=start):
            batch = read_batch(self.store, LAYOUT, LAYOUT.id_of(info.key))
            if batch is None:
                continue
            if len(page) == limit:
                return page, True
            page.append(batch)
        return page, False

    def cancel(self, owner: str, batch_id: str) -> BatchDocument:
        """validating or in_progress -> cancelling (the driver stops the workers and writes the files)."""
        self.get(owner, batch_id)
        moved = transition(self.store, batch_id, "cancelling", now=int(self.clock()))
        batch = moved.batch
        if moved.outcome is Outcome.NOT_ALLOWED and batch.status != "cancelled":
            status = batch.ending or batch.status
            raise APIError(409, f"Cannot cancel a batch with status '{status}'.", code="batch_not_cancellable")
        if moved.outcome is Outcome.APPLIED:
            log.info("%s: cancel requested", batch_id)
        return batch


def batch_object(batch: BatchDocument) -> dict[str, Any]:
    """The OpenAI batch object."""
    usage = batch.usage
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": {"object": "list", "data": [e.model_dump() for e in batch.errors]} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": batch.created_at,
        "in_progress_at": batch.in_progress_at,
        "expires_at": batch.expires_at,
        "finalizing_at": batch.finalizing_at,
        "completed_at": batch.completed_at,
        "failed_at": batch.failed_at,
        "expired_at": batch.expired_at,
        "cancelling_at": batch.cancelling_at,
        "cancelled_at": batch.cancelled_at,
        "request_counts": batch.request_counts.model_dump(),
        "metadata": batch.metadata,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > _METADATA_KEYS or any(
        len(k) > _METADATA_KEY_CHARS or len(v) > _METADATA_VALUE_CHARS for k, v in metadata.items()
    ):
        raise APIError(
            400,
            f"Invalid 'metadata': at most {_METADATA_KEYS} pairs, keys up to {_METADATA_KEY_CHARS} characters, "
            f"values up to {_METADATA_VALUE_CHARS}.",
            param="metadata",
        )


def _request_hash(input_file_id: str, endpoint: str, completion_window: str, metadata: dict[str, str] | None) -> str:
    fields = {
        "input_file_id": input_file_id,
        "endpoint": endpoint,
        "completion_window": completion_window,
        "metadata": metadata,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _key_hash(idempotency_key: str) -> str:
    """Keys are the client's text, of any length and characters: their hash is what names them in the store."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def _check_same_request(claim: IdempotencyRecord, request: str) -> None:
    if claim.request != request:
        raise APIError(
            400,
            f"This Idempotency-Key was already used for another request (which created {claim.batch_id}): "
            "send a new key for a new batch, or the first request's parameters to get its batch again.",
            code="idempotency_key_reused",
        )


def _quoted(values: Any) -> str:
    return ", ".join(repr(v) for v in values)

"""A run store in an S3-compatible bucket (AWS S3, Cloudflare R2, MinIO, SeaweedFS) through boto3.

Conditional writes use the headers S3 defines: `If-None-Match: *` to create, `If-Match: <etag>`
to swap. A lost race comes back as HTTP 412 (AWS may also answer 409 under contention); both
become `PreconditionFailed`. Throttling, 5xx answers, dropped connections and timeouts are retried
by botocore's standard mode (exponential backoff with jitter), within the connect/read timeouts
and attempts of `StoreSettings`; what still fails is `StoreUnavailable` (a passing condition that
workers and `orch watch` wait out), any other refusal a plain `StoreError`. A conditional write
that was retried may have succeeded on an attempt whose answer was lost; the retry then sees 412
for our own write, so on every 412 the store reads the object back and counts identical bytes as
success.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlparse

from orchestrator.core.errors import NotFound, PreconditionFailed, StoreError, StoreUnavailable
from orchestrator.core.store.base import (
    LIST_PAGE_SIZE,
    Blob,
    ObjectInfo,
    RequestCounter,
    StoreSettings,
    check_key,
    ignore_stray,
)

_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
#: Answers that say "not now" rather than "no": the store is there but cannot serve us yet.
_PASSING_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "ServiceUnavailable",
    "InternalError",
}


class S3Store:
    """Objects under `s3://bucket/prefix` (or `r2://bucket/prefix`)."""

    shared = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        scheme: str = "s3",
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
        client: Any = None,
    ):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.uri = f"{scheme}://{bucket}/{self.prefix}".rstrip("/")
        self.requests = RequestCounter()
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                # Standard mode: exponential backoff with jitter on throttling, 5xx, dropped
                # connections and timeouts. `total_max_attempts` counts the first try
                # (botocore's `max_attempts` does not: 8 there was 9 tries of 60 s each).
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                # MinIO, SeaweedFS and most endpoints other than AWS want path-style addressing.
                s3={"addressing_style": "path" if endpoint_url else "auto"},
                max_pool_connections=64,
            )
            client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=config,
            )
        self.client = client

    # -- reads -------------------------------------------------------------------------------
    def get(self, key: str) -> Blob:
        self.requests.add("get")
        with self._errors(key):
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
            return Blob(resp["Body"].read(), resp["ETag"])

    def head(self, key: str) -> ObjectInfo | None:
        self.requests.add("head")
        try:
            with self._errors(key):
                resp = self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except NotFound:
            return None
        return ObjectInfo(key, resp["ContentLength"], resp["LastModified"].timestamp(), resp.get("ETag"))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        full_prefix = self._prefixed(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        extra = {"StartAfter": self._prefixed(start_after)} if start_after else {}
        pages = paginator.paginate(
            Bucket=self.bucket, Prefix=full_prefix, PaginationConfig={"PageSize": LIST_PAGE_SIZE}, **extra
        )
        with self._errors(prefix):
            for page in pages:
                self.requests.add("list")
                for obj in page.get("Contents", ()):
                    if obj["Key"].endswith("/"):
                        # A "folder" that S3 consoles create: no object orch could address.
                        ignore_stray(obj["Key"], "an S3 console folder marker, not an object")
                        continue
                    yield ObjectInfo(obj["Key"][strip:], obj["Size"], obj["LastModified"].timestamp(), obj.get("ETag"))

    @contextlib.contextmanager
    def open(self, key: str) -> Iterator[BinaryIO]:
        self.requests.add("get")
        with self._errors(key):
            body = self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"]
        with contextlib.closing(body):
            yield io.BufferedReader(_StreamingRaw(body, f"{self.uri}/{key}"), 1 << 20)

    def check_space(self) -> None:
        """No space limit to check here."""

    # -- writes ------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> str:
        self.requests.add("put")
        with self._errors(key):
            return str(self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data)["ETag"])

    def put_file(self, key: str, path: str) -> None:
        self.requests.add("put")
        with self._errors(key):
            self.client.upload_file(path, self.bucket, self._full(key))

    def put_if_absent(self, key: str, data: bytes) -> str:
        self.requests.add("put_if_absent")
        return self._conditional_put(key, data, IfNoneMatch="*")

    def compare_and_swap(self, key: str, data: bytes, etag: str) -> str:
        self.requests.add("compare_and_swap")
        return self._conditional_put(key, data, IfMatch=etag)

    def delete(self, key: str) -> None:
        self.requests.add("delete")
        with self._errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    # -- internals ---------------------------------------------------------------------------
    def _conditional_put(self, key: str, data: bytes, **condition: str) -> str:
        try:
            with self._errors(key):
                resp = self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, **condition)
            return str(resp["ETag"])
        except (PreconditionFailed, NotFound):
            # Our own earlier attempt may be what the condition now fails against.
            try:
                current = self.get(key)
            except NotFound:
                raise PreconditionFailed(key) from None
            if current.data == data:
                return current.etag
            raise PreconditionFailed(key) from None

    def _full(self, key: str) -> str:
        return self._prefixed(check_key(key))

    def _prefixed(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        try:
            yield
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _PRECONDITION_CODES or status in ("412", "409"):
                raise PreconditionFailed(key) from None
            if code in _MISSING_CODES:
                raise NotFound(key) from None
            message = f"{self.uri}: {code or status} on {key!r}: {e.response.get('Error', {}).get('Message', e)}"
            if code in _PASSING_CODES or status.startswith("5"):
                raise StoreUnavailable(message, hint="the store is overloaded or failing; try again later") from e
            raise StoreError(message, hint=_hint_for(code)) from e
        except (BotoConnectionError, HTTPClientError) as e:
            # Refused or dropped connections and timeouts, after botocore's retries.
            raise StoreUnavailable(
                f"{self.uri}: no answer for {key!r}: {e}",
                hint="check the endpoint and the network (store_settings in the spec set the timeouts)",
            ) from e
        except BotoCoreError as e:  # no credentials, a bad parameter: asking again will not help
            raise StoreError(
                f"{self.uri}: cannot complete the request for {key!r}: {e}",
                hint="check the endpoint, the network and the credentials",
            ) from e


class _StreamingRaw(io.RawIOBase):
    """Lets io.BufferedReader read a botocore StreamingBody line by line."""

    def __init__(self, body: Any, where: str):
        self._body = body
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._body.read(len(buffer))
        except Exception as e:  # botocore and urllib3 errors alike: the connection broke mid-object
            raise StoreUnavailable(f"{self._where}: the connection broke while reading: {e}") from e
        buffer[: len(data)] = data
        return len(data)


def _hint_for(code: str) -> str | None:
    return {
        "NoSuchBucket": "create the bucket first, or fix the bucket name in --store",
        "AccessDenied": "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or R2_*)",
        "InvalidAccessKeyId": "check the credentials (AWS_ACCESS_KEY_ID or R2_ACCESS_KEY_ID)",
        "SignatureDoesNotMatch": "check the secret key (AWS_SECRET_ACCESS_KEY or R2_SECRET_ACCESS_KEY)",
    }.get(code)


def from_uri(uri: str, settings: StoreSettings | None = None, *, worker: bool = False) -> S3Store:
    """`s3://bucket/prefix[?endpoint=URL&region=R]` or `r2://bucket/prefix`.

    Endpoints: the `endpoint` query parameter first, then ORCH_S3_ENDPOINT_URL (s3) or
    R2_ENDPOINT_URL / R2_ACCOUNT_ID (r2); plain `s3://` otherwise follows boto3's own
    configuration (AWS_ENDPOINT_URL, profiles, instance roles).
    """
    parsed = urlparse(uri)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/")
    if not bucket:
        raise StoreError(f"store URI {uri!r} has no bucket", hint="write it as s3://BUCKET/PREFIX")
    endpoint = query.get("endpoint")
    region = query.get("region")
    access_key = secret_key = None
    if parsed.scheme == "r2":
        endpoint = endpoint or os.environ.get("R2_ENDPOINT_URL")
        if not endpoint:
            account = os.environ.get("R2_ACCOUNT_ID")
            if not account:
                raise StoreError(
                    f"store {uri}: no R2 endpoint",
                    hint="set R2_ACCOUNT_ID (or R2_ENDPOINT_URL, or ?endpoint=URL in the store URI)",
                )
            endpoint = f"https://{account}.r2.cloudflarestorage.com"
        region = region or "auto"
        access_key = os.environ.get("R2_ACCESS_KEY_ID")
        secret_key = os.environ.get("R2_SECRET_ACCESS_KEY")
    else:
        endpoint = endpoint or os.environ.get("ORCH_S3_ENDPOINT_URL")
    settings = settings or StoreSettings()
    return S3Store(
        bucket,
        prefix,
        endpoint_url=endpoint,
        region=region,
        access_key=access_key,
        secret_key=secret_key,
        scheme=parsed.scheme,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.worker_read_timeout if worker else settings.read_timeout,
        max_attempts=settings.worker_attempts if worker else settings.attempts,
    )

"""The S3 store rides out throttling, 5xx answers and lost responses, against a real server."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.core.store import PreconditionFailed
from orchestrator.core.store.s3 import S3Store
from tests.support.flaky_proxy import FlakyProxy

pytestmark = pytest.mark.slow


def _store_via(proxy: FlakyProxy, bucket: str) -> S3Store:
    return S3Store(bucket, "retries", endpoint_url=proxy.endpoint, region="us-east-1", max_attempts=6)


def test_s3_store_retries_through_throttling_and_5xx(moto_s3_server):
    bucket = moto_s3_server.new_bucket()
    counter = itertools.count()
    # Every other request is refused with 503 SlowDown.
    with FlakyProxy(moto_s3_server.endpoint, lambda *_: "503" if next(counter) % 2 == 0 else "forward") as proxy:
        store = _store_via(proxy, bucket)
        store.put("a", b"1")
        assert store.get("a").data == b"1"
        store.put_if_absent("b", b"2")
        assert sorted(o.key for o in store.list("")) == ["a", "b"]
    assert sum(1 for _, _, action in proxy.log if action == "503") >= 4


def test_s3_store_conditional_create_survives_a_lost_response(moto_s3_server):
    """The first attempt writes but its answer is lost; the retry meets 412 from our own write."""
    bucket = moto_s3_server.new_bucket()
    dropped = []

    def policy(method, path, headers):
        if method == "PUT" and "If-None-Match" in headers and not dropped:
            dropped.append(path)
            return "drop-response"
        return "forward"

    with FlakyProxy(moto_s3_server.endpoint, policy) as proxy:
        store = _store_via(proxy, bucket)
        etag = store.put_if_absent("lease/c1", b"holder-A")
        assert dropped, "the proxy did not drop anything"
        assert store.get("lease/c1").etag == etag
        # A different writer still loses.
        with pytest.raises(PreconditionFailed):
            store.put_if_absent("lease/c1", b"holder-B")


def test_s3_store_compare_and_swap_survives_a_lost_response(moto_s3_server):
    bucket = moto_s3_server.new_bucket()
    dropped = []

    def policy(method, path, headers):
        if method == "PUT" and "If-Match" in headers and not dropped:
            dropped.append(path)
            return "drop-response"
        return "forward"

    with FlakyProxy(moto_s3_server.endpoint, policy) as proxy:
        store = _store_via(proxy, bucket)
        etag = store.put("lease/c2", b"v1")
        store.compare_and_swap("lease/c2", b"v2-holder-A", etag)
        assert dropped
        assert store.get("lease/c2").data == b"v2-holder-A"

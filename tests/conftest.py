"""Fixtures shared by every test: real S3 servers on 127.0.0.1, stores of each backend, a clean HOME."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.support import s3servers

# Every S3 client in the tests (and in the workers they start) talks to local servers only.
os.environ.setdefault("AWS_ACCESS_KEY_ID", s3servers.ACCESS_KEY)
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", s3servers.SECRET_KEY)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@pytest.fixture(autouse=True)
def no_local_worker_outlives_its_test():
    """A test that fails or times out mid-run leaves the local workers it started running (they are
    detached, as a launched job is): they are stopped here, so the next tests get the CPUs."""
    from orchestrator.backends.local import started_here, stop_started_here

    before = started_here()
    yield
    left = stop_started_here(keep=before, grace_s=10)
    if left:
        print(f"stopped local workers this test left running: pids {left}")


@pytest.fixture(scope="session")
def seaweedfs_server():
    with s3servers.seaweedfs() as server:
        yield server


@pytest.fixture(scope="session")
def moto_s3_server():
    with s3servers.moto_server() as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs_bucket(seaweedfs_server):
    return seaweedfs_server.new_bucket()


def make_store_uri(kind: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty store of the given kind, as a URI a subprocess can open too."""
    if kind == "local":
        return str(tmp_path / "store")
    server = request.getfixturevalue("seaweedfs_server" if kind == "seaweedfs" else "moto_s3_server")
    bucket = request.getfixturevalue("seaweedfs_bucket") if kind == "seaweedfs" else server.new_bucket()
    return server.store_uri(bucket, f"t-{uuid.uuid4().hex[:10]}")


@pytest.fixture(params=["local", "seaweedfs"])
def store_uri(request, tmp_path) -> str:
    """The local directory and the real S3 server: what end-to-end suites run against."""
    if request.param != "local":
        request.applymarker(pytest.mark.slow)
    return make_store_uri(request.param, request, tmp_path)

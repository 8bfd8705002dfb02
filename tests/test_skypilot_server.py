"""The SkyPilot backend against a real SkyPilot API server on this machine (consolidation mode).

No cloud is reachable here, so every managed job really goes PENDING -> STARTING ->
FAILED_PRECHECKS (NoCloudAccessError); everything up to the cloud is SkyPilot's own code: the API
server, its jobs controller, request ids, `sky.get`, `queue_v2` records and cancel. orch runs as a
user runs it (its CLI in subprocesses), against a real S3 store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from orchestrator.core.layout import RunLayout
from orchestrator.core.store import open_store
from tests.support import s3servers, sky_plugins
from tests.support.datasets import write_jsonl
from tests.support.events import wait_for
from tests.support.models import REPO
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("skypilot_server"),
]  # one xdist worker: its tests share the module's API server

ORCH = [sys.executable, "-m", "orchestrator"]
SKY = str(Path(sys.executable).parent / "sky")
CANARY = "hf_orch_canary_4d1b"


@pytest.fixture(scope="module")
def sky_env(tmp_path_factory):
    """A HOME with SkyPilot set up for a local run: jobs controller inside the API server, an
    accelerator catalog (the real one is fetched from the internet), and a server stopped after."""
    if shutil.which("rsync") is None:
        pytest.fail("SkyPilot's local jobs controller needs rsync: apt-get install rsync (.ci/run does)")
    home = tmp_path_factory.mktemp("sky-home")
    (home / ".sky").mkdir()
    (home / ".sky" / "config.yaml").write_text("jobs:\n  controller:\n    consolidation_mode: true\n")
    # The request queues its config chooses for a local server (tests/support/sky_plugins.py says why).
    (home / ".sky" / "plugins.yaml").write_text("plugins:\n  - class: tests.support.sky_plugins.LocalRequestQueues\n")
    catalog = home / ".sky" / "catalogs" / "v8" / "common"
    catalog.mkdir(parents=True)
    (catalog / "accelerators.csv").write_text(
        'AcceleratorName,Clouds\nL4,"AWS,GCP"\nA10G,AWS\nL40S,"AWS,GCP"\nA100,"AWS,GCP"\nA100-80GB,"AWS,GCP"\n'
    )
    env = dict(
        os.environ,
        HOME=str(home),
        SKYPILOT_DISABLE_USAGE_COLLECTION="1",
        HF_TOKEN=CANARY,
        AWS_ACCESS_KEY_ID=s3servers.ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=s3servers.SECRET_KEY,
        # Not SkyPilot's default 46580: it lies in the kernel's ephemeral range, where another test's
        # connection can hold it (CI: "Port 46580 is not available"). Client and server both read it.
        SKYPILOT_API_SERVER_LOCAL_PORT=str(free_port()),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),  # the plugin
    )
    # One left on this port by another HOME would answer for the wrong state.
    subprocess.run([SKY, "api", "stop"], env=env, capture_output=True, timeout=120)
    _start_api_server(env, home)
    yield env
    subprocess.run([SKY, "api", "stop"], env=env, capture_output=True, timeout=120)


START_ATTEMPTS = 3
#: What SkyPilot's server logs when its start failed (sky/server/server.py). Its process may stay:
#: the interpreter's exit then waits forever for the request-queue manager it had spawned, a child
#: that is not a daemon, so the server neither answers nor exits (seen in CI: its 600 s hang guard).
START_FAILED = "Failed to start SkyPilot API server: "


def _start_api_server(env: dict[str, str], home: Path) -> None:
    """Started here, once: orch's first call would start it too, but SkyPilot waits only 60 s for
    it, and on a loaded machine it takes longer (it goes on starting after SkyPilot gives up). The
    server runs on process-local request queues (tests/support/sky_plugins.py: SkyPilot's spawned
    queue manager missed its fixed 60 s three starts in a row in CI), checked in its log. A
    server that died, or failed and hangs (START_FAILED), is stopped and started again, up to
    START_ATTEMPTS times; what each start said is kept for the failure message."""
    log = home / ".sky" / "api_server" / "server.log"  # each start truncates it

    def state() -> str | None:
        if _api_server_healthy(env):
            return "healthy"
        if log.exists() and START_FAILED in log.read_text(errors="replace"):
            return "failed"
        return None if _api_server_running(env) else "exited"

    said = []
    for attempt in range(START_ATTEMPTS):
        if attempt:  # kills a hung one and what it left (its queue manager)
            subprocess.run([SKY, "api", "stop"], env=env, capture_output=True, timeout=120)
        start = subprocess.run([SKY, "api", "start"], env=env, capture_output=True, text=True, timeout=600)
        try:
            up = wait_for(f"the SkyPilot API server to answer, fail or exit (start {attempt + 1})", state, 420, every=1)
        except AssertionError as hung:  # the hang guard: neither healthy nor failed nor gone
            up = str(hung)
        if up == "healthy":
            assert sky_plugins.INSTALLED in log.read_text(errors="replace"), "the plugin did not load"
            return
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        said.append(f"start {attempt + 1}: {up}; {start.stdout}{start.stderr}\n{log}:\n{tail}")
        print(said[-1], flush=True)
    pytest.fail("\n\n".join(said))


def _api_server_running(env: dict[str, str]) -> bool:
    """A SkyPilot API server process for the env's local port is alive."""
    port = f"--port={env['SKYPILOT_API_SERVER_LOCAL_PORT']}"
    for process in psutil.process_iter(["cmdline", "status"]):
        line = process.info["cmdline"] or []
        if "sky.server.server" in line and port in line and process.info["status"] != psutil.STATUS_ZOMBIE:
            return True
    return False


def _api_server_healthy(env: dict[str, str]) -> bool:
    """SkyPilot's health endpoint on the env's local port says healthy (no client is started)."""
    url = f"http://127.0.0.1:{env['SKYPILOT_API_SERVER_LOCAL_PORT']}/api/health"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read()).get("status") == "healthy"
    except (OSError, ValueError):
        return False


def orch(env, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*ORCH, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_skypilot_backend_launches_watches_and_cancels_through_a_real_api_server(sky_env, seaweedfs_server, tmp_path):
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "sky", "--store", store_uri]
    data = write_jsonl(
        tmp_path / "q.jsonl",
        [{"id": f"q{i}", "conversation": [{"role": "user", "content": f"Q{i}?"}]} for i in range(10)],
    )
    assert orch(sky_env, "prepare", str(data), *run, "--num-chunks", "2", "--id-column", "id").returncode == 0

    # 1. Launch: both workers submitted, SkyPilot's job ids recorded in the store.
    launched = orch(sky_env, "launch", *run, "--backend", "skypilot", "--workers", "2", "--model", "org/model")
    assert launched.returncode == 0, launched.stderr
    store, layout = open_store(store_uri), RunLayout("sky")
    jobs = json.loads(store.get(layout.jobs).data)
    first_ids = {w: j["attempts"][0]["job_id"] for w, j in jobs["workers"].items()}
    assert sorted(first_ids) == ["0", "1"] and all(i.isdigit() for i in first_ids.values())
    assert all(f"job {i}" in launched.stdout for i in first_ids.values())

    # 2. Status shows SkyPilot's own states until the jobs end (no cloud: FAILED_PRECHECKS).
    seen: set[str] = set()
    deadline = time.monotonic() + 1200  # a hang guard: the server's jobs controller shares the CPU with a suite
    while time.monotonic() < deadline:
        status = orch(sky_env, "status", *run, "--json")
        assert status.returncode == 0, status.stderr
        workers = json.loads(status.stdout)["workers"]
        seen |= {w["state"] for w in workers}
        if all(w["state"] == "FAILED_PRECHECKS" for w in workers):
            break
        time.sleep(2)
    assert seen <= {"PENDING", "STARTING", "FAILED_PRECHECKS"}, seen
    assert [w["job_id"] for w in workers] == [first_ids["0"], first_ids["1"]]
    assert all(w["state"] == "FAILED_PRECHECKS" and w["cloud"] is None and w["spot"] is None for w in workers)

    # 3. The loop relaunches each failed worker within its budget, then stops and says why.
    watched = orch(sky_env, "watch", *run, "--retries", "1", "--interval", "2")
    assert watched.returncode == 7, watched.stdout + watched.stderr
    assert "relaunch after FAILED_PRECHECKS" in watched.stdout
    assert "1 relaunches spent" in watched.stderr and "Cloud access is not set up" in watched.stderr
    assert "\x1b[" not in watched.stdout + watched.stderr  # SkyPilot's colour codes stripped
    jobs = json.loads(store.get(layout.jobs).data)
    assert all(len(j["attempts"]) == 2 and j["relaunches"] == 1 for j in jobs["workers"].values())

    # 4. Cancel answers through the real server; nothing of the secret reached orch's files or output.
    cancelled = orch(sky_env, "cancel", *run)
    assert cancelled.returncode == 0, cancelled.stderr
    for info in store.list(layout.root):
        assert CANARY.encode() not in store.get(info.key).data, info.key
    assert CANARY not in launched.stdout + launched.stderr + watched.stdout + watched.stderr

"""Workers as SkyPilot managed jobs on a real Slurm cluster on this machine, a lost allocation recovered.

scripts/local-slurm starts a one-node Slurm cluster (munge, slurmctld, slurmd, an sshd on
127.0.0.1) and a SkyPilot API server whose jobs controller runs inside it; everything from orch's
CLI to the worker processes is the real thing: SkyPilot provisions with sbatch, installs its
runtime on the node, runs the task with srun, and its controller recovers the job when its
allocation is taken away (scancel), as it recovers a preempted spot machine. The workers run
vLLM on the CPU against a real S3 store (SeaweedFS on 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orchestrator.core.protocol.layout import RunLayout
from orchestrator.core.store import open_store
from tests.support import s3servers
from tests.support.datasets import write_jsonl

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator"]
T = TypeVar("T")


@pytest.fixture(scope="module")
def slurm_env():
    """The local cluster up for this module (scripts/local-slurm up, as root), and the settings
    SkyPilot's client and the Slurm commands need; stopped after (scripts/local-slurm down)."""
    script = str(ROOT / "scripts" / "local-slurm")
    up = subprocess.run([script, "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(f"scripts/local-slurm up failed (it needs root and Debian's packages):\n{up.stdout}{up.stderr}")
    settings = dict(
        line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("export ")
    )
    keys = {"AWS_ACCESS_KEY_ID": s3servers.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3servers.SECRET_KEY}
    yield dict(os.environ, **settings, **keys)
    if not os.environ.get("ORCH_LOCAL_SLURM_KEEP"):  # kept up between runs while working on this file
        subprocess.run([script, "down"], capture_output=True, timeout=300)


def orch(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """orch as a user runs it, from the project folder (env's PWD) that holds its orch.yaml."""
    return subprocess.run([*ORCH, *args], env=env, cwd=env["PWD"], capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 600) -> T:
    """Poll until `probe` gives something (an event happened); fail saying what never came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def squeue(env: dict[str, str]) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True, check=True)
    return [tuple(line.split(" ", 1)) for line in out.stdout.splitlines() if line.strip()]  # type: ignore[misc]


def parts(store: Any, layout: RunLayout, worker: int) -> dict[str, str]:
    """Output parts flushed by processes of `worker`: key -> holder (the process, named in the key)."""
    found: dict[str, str] = {}
    for info in store.list(layout.outputs_root):
        holder = info.key.rsplit("/", 1)[1].rsplit("-", 1)[0]
        if holder.startswith(f"{worker}."):
            found[info.key] = holder
    return found


def holders(store: Any, layout: RunLayout, worker: int) -> dict[str, float]:
    """Processes of `worker` that flushed output, each with when this test first saw one of its parts."""
    return {holder: time.monotonic() for holder in parts(store, layout, worker).values()}


class Watcher:
    """What the test sees of the run over time: SkyPilot's job states through `orch status`, and
    each worker process's first flushed rows in the store."""

    def __init__(self, env: dict[str, str], run: list[str], store: Any, layout: RunLayout):
        self.env, self.run, self.store, self.layout = env, run, store, layout
        self.states: dict[str, list[str]] = {}
        self.first_rows: dict[str, float] = {}
        self.workers: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        status = orch(self.env, "status", *self.run, "--json")
        assert status.returncode == 0, status.stderr
        self.workers = json.loads(status.stdout)["workers"]
        for w in self.workers:
            seen = self.states.setdefault(str(w["worker"]), [])
            if not seen or seen[-1] != w["state"]:
                seen.append(w["state"])
        for worker in (0, 1):
            for holder, at in holders(self.store, self.layout, worker).items():
                self.first_rows.setdefault(holder, at)
        return self.workers

    def worker(self, i: int) -> dict[str, Any]:
        return next(w for w in self.workers if str(w["worker"]) == str(i))


def test_slurm_workers_answer_survive_a_lost_allocation_and_cancel_leaves_nothing(
    slurm_env, seaweedfs_server, tmp_path
):
    env = slurm_env
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "sl", "--store", store_uri]
    (tmp_path / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 48\n  temperature: 0\n"
        "model:\n  engine_args: {max_num_seqs: 4}\n"
        # A lease outlives the lost worker's recovery: its chunk waits for it, no one else resumes it.
        "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 900\n"
        "resources:\n  gpus: []\n  cpus: 1\n  memory: 4\n"
        f"  worker_env: {(ROOT / '.venv-worker').resolve()}\n"
        "  job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 1}\n"
    )
    env = dict(env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    rows = 800
    data = write_jsonl(
        tmp_path / "q.jsonl",
        [{"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}?"}]} for i in range(rows)],
    )
    # The weights where every node reads them (a cluster's shared disk), readable by the job's user.
    model = Path(env["ORCH_LOCAL_SLURM_SHARED"]) / "tiny-llama"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(ROOT / ".cache" / "models" / "tiny-llama", model)
    for path in [model, *model.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    # One chunk per worker: the lost worker's chunk is its only one, and its lease keeps it for it.
    prepared = orch(env, "prepare", str(data), *run, "--num-chunks", "2", "--id-column", "id", "--model", str(model))
    assert prepared.returncode == 0, prepared.stderr
    store, layout = open_store(store_uri), RunLayout("sl")
    watch = Watcher(env, run, store, layout)
    cluster = env["ORCH_LOCAL_SLURM_NAME"]

    # 1. Launch both workers as managed jobs on the Slurm cluster; each answers (first start-up).
    started = time.monotonic()
    launched = orch(env, "launch", *run, "--backend", "skypilot", "--workers", "2", "--infra", f"slurm/{cluster}")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    first_part = wait_for("worker 0's first rows", lambda: next(iter(parts(store, layout, 0)), None))
    first_startup = time.monotonic() - started

    w0 = watch.poll() and watch.worker(0)
    assert w0["state"] == "RUNNING" and w0["cloud"] == "Slurm" and w0["region"] == cluster, w0

    # 2. Take worker 0's allocation away mid-chunk, with no warning (SIGKILL to everything in it).
    (alloc,) = [job for job, name in squeue(env) if name.startswith("orch-sl-w0")]
    subprocess.run(["scancel", "--signal=KILL", "--full", alloc], env=env, check=True)
    lost = time.monotonic()
    chunk = first_part.split("/")[-2]
    assert store.head(layout.done(chunk)) is None, f"chunk {chunk} finished before the loss: make it bigger"
    old_holders = set(parts(store, layout, 0).values())

    # 3. SkyPilot's controller notices, provisions a new allocation, and the worker answers again.
    wait_for("worker 0 recovering", lambda: watch.poll() and watch.worker(0)["state"] == "RECOVERING", 300)
    wait_for(
        "worker 0 answering again",
        lambda: watch.poll() and any(h.startswith("0.") and h not in old_holders for h in watch.first_rows),
        600,
    )
    recovered = min(at for h, at in watch.first_rows.items() if h.startswith("0.") and h not in old_holders) - lost
    assert watch.states["0"][-3:] == ["RUNNING", "RECOVERING", "RUNNING"], watch.states
    assert watch.worker(0)["recovery_count"] >= 1

    # 4. Both finish; every row exactly once, and the lost chunk resumed from its checkpoints.
    wait_for("both workers done", lambda: watch.poll() and all(w["state"] == "SUCCEEDED" for w in watch.workers), 600)
    out = tmp_path / "answers.jsonl"
    collected = orch(env, "collect", *run, "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"q{i}" for i in range(rows))
    by_holder: dict[str, set[str]] = {}
    for info in store.list(layout.outputs_prefix(chunk)):
        holder = info.key.rsplit("/", 1)[1].rsplit("-", 1)[0]
        lines = store.get(info.key).data.decode().splitlines()
        by_holder.setdefault(holder, set()).update(json.loads(line)["custom_id"] for line in lines)
    before = set().union(*(ids for h, ids in by_holder.items() if h in old_holders))
    after = set().union(*(ids for h, ids in by_holder.items() if h not in old_holders))
    assert before and after and not before & after, "the resumed process redid flushed rows"

    # 5. Cancel: no managed job live, no Slurm allocation left.
    cancelled = orch(env, "cancel", *run)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for("no Slurm allocation", lambda: not squeue(env) or None, 300)
    final = watch.poll()
    assert all(w["state"] in ("SUCCEEDED", "CANCELLED") for w in final), final
    print(
        f"\nslurm: first start-up {first_startup:.0f}s, allocation lost -> rows again {recovered:.0f}s "
        f"({recovered / first_startup:.2f}x), test {time.monotonic() - started:.0f}s, states {watch.states}"
    )
    assert recovered <= 2 * first_startup

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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orchestrator.core.protocol.heartbeats import read_heartbeats
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
    script = [*([] if os.geteuid() == 0 else ["sudo", "-n", "-E"]), str(ROOT / "scripts" / "local-slurm")]
    up = subprocess.run([*script, "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(f"scripts/local-slurm up failed (it needs root and Debian's packages):\n{up.stdout}{up.stderr}")
    settings = dict(
        line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("export ")
    )
    keys = {"AWS_ACCESS_KEY_ID": s3servers.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3servers.SECRET_KEY}
    yield dict(os.environ, **settings, **keys)
    if not os.environ.get("ORCH_LOCAL_SLURM_KEEP"):  # kept up between runs while working on this file
        subprocess.run([*script, "down"], capture_output=True, timeout=300)


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


def parts(store: Any, layout: RunLayout, worker: int | None = None, chunk: str | None = None) -> dict[str, str]:
    """Flushed output parts (of one worker's processes, of one chunk): key -> holder, the process
    that wrote it (`<worker>.<process>`, named in the key)."""
    prefix = layout.outputs_prefix(chunk) if chunk else layout.outputs_root
    found = {info.key: info.key.rsplit("/", 1)[1].rsplit("-", 1)[0] for info in store.list(prefix)}
    return {k: h for k, h in found.items() if worker is None or h.startswith(f"{worker}.")}


class StatusWatch(threading.Thread):
    """`orch status --json` over and over, as a user watching would, in the background: each
    worker's states in the order seen, with when each was first seen."""

    def __init__(self, env: dict[str, str], run: list[str]):
        super().__init__(daemon=True)
        self.env, self.run_args = env, run
        self.states: dict[str, list[tuple[str, float]]] = {}
        self.workers: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            status = orch(self.env, "status", *self.run_args, "--json")
            if status.returncode != 0:
                self.errors.append(status.stderr)
                continue
            self.workers = json.loads(status.stdout)["workers"]
            for w in self.workers:
                seen = self.states.setdefault(str(w["worker"]), [])
                if not seen or seen[-1][0] != w["state"]:
                    seen.append((w["state"], time.monotonic()))

    def sequence(self, worker: int) -> list[str]:
        return [state for state, _ in self.states.get(str(worker), [])]

    def worker(self, i: int) -> dict[str, Any] | None:
        return next((w for w in self.workers if str(w["worker"]) == str(i)), None)


def holder_of(store: Any, layout: RunLayout, worker: int) -> str | None:
    """The process of `worker` that beat last (a new one after a recovery)."""
    beat = read_heartbeats(store, layout).get(str(worker))
    return beat.holder if beat else None


def test_slurm_workers_answer_survive_a_lost_allocation_and_cancel_leaves_nothing(
    slurm_env, seaweedfs_server, tmp_path
):
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "sl", "--store", store_uri]
    (tmp_path / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 32\n  temperature: 0\n"
        "model:\n  engine_args: {max_num_seqs: 4}\n"
        # A lease outlives the lost worker's recovery: no one takes its chunk for an expired lease.
        "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 900\n"
        "resources:\n  gpus: []\n  cpus: 1\n  memory: 4\n"
        f"  worker_env: {(ROOT / '.venv-worker').resolve()}\n"
        "  job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 1}\n"
    )
    rows = 400
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
    prepared = orch(env, "prepare", str(data), *run, "--num-chunks", "2", "--id-column", "id", "--model", str(model))
    assert prepared.returncode == 0, prepared.stderr
    store, layout = open_store(store_uri), RunLayout("sl")
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    watch = StatusWatch(env, run)

    # 1. Launch both workers as managed jobs on the Slurm cluster; each answers (first start-up).
    started = time.monotonic()
    launched = orch(env, "launch", *run, "--backend", "skypilot", "--workers", "2", "--infra", f"slurm/{cluster}")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    watch.start()
    first_process = wait_for("worker 0's process", lambda: holder_of(store, layout, 0))
    first_startup = time.monotonic() - started
    first_part = wait_for("worker 0's first rows", lambda: next(iter(parts(store, layout, 0)), None))
    first_rows = time.monotonic() - started

    # 2. At once, take worker 0's allocation away mid-chunk, with no warning (SIGKILL to all in it).
    (alloc,) = [job for job, name in squeue(env) if name.startswith("orch-sl-w0")]
    subprocess.run(["scancel", "--signal=KILL", "--full", alloc], env=env, check=True)
    lost = time.monotonic()
    chunk = first_part.split("/")[-2]
    assert store.head(layout.done(chunk)) is None, f"chunk {chunk} finished before the loss: make it bigger"
    old_holders = set(parts(store, layout, chunk=chunk).values())

    # 3. SkyPilot's controller notices and recovers the job in a new allocation; a new worker 0 process runs.
    wait_for("worker 0 recovering", lambda: "RECOVERING" in watch.sequence(0), 300)
    wait_for("a new worker 0 process", lambda: holder_of(store, layout, 0) not in (None, first_process), 600)
    recovered = time.monotonic() - lost

    # 4. Both finish; every row exactly once, and the lost chunk resumed from its checkpoints (by
    # worker 0 back, or by worker 1 once its own chunk was done: the run's dynamic finish).
    wait_for("both workers done", lambda: watch.sequence(0)[-1:] == watch.sequence(1)[-1:] == ["SUCCEEDED"], 600)
    states = watch.sequence(0)  # RUNNING -> RECOVERING -> (RUNNING: a new process, seen above) -> SUCCEEDED
    assert "RUNNING" in states[: states.index("RECOVERING")], watch.states
    w0 = watch.worker(0)
    assert w0 and w0["recovery_count"] >= 1 and w0["cloud"] == "Slurm" and w0["region"] == cluster, w0
    out = tmp_path / "answers.jsonl"
    collected = orch(env, "collect", *run, "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"q{i}" for i in range(rows))
    by_holder: dict[str, set[str]] = {}
    for key, holder in parts(store, layout, chunk=chunk).items():
        lines = store.get(key).data.decode().splitlines()
        by_holder.setdefault(holder, set()).update(json.loads(line)["custom_id"] for line in lines)
    before = set().union(*(ids for h, ids in by_holder.items() if h in old_holders))
    after = set().union(*(ids for h, ids in by_holder.items() if h not in old_holders))
    assert before and after and not before & after, "the chunk was not resumed from its checkpoints"

    # 5. Cancel: no managed job live, no Slurm allocation left.
    cancelled = orch(env, "cancel", *run)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for("no Slurm allocation", lambda: not squeue(env) or None, 300)
    watch.done.set()
    watch.join(timeout=120)
    assert all(w["state"] in ("SUCCEEDED", "CANCELLED") for w in watch.workers), watch.workers
    print(
        f"\nslurm: worker 0 process up {first_startup:.0f}s after launch (first rows {first_rows:.0f}s); "
        f"allocation lost -> new process up {recovered:.0f}s ({recovered / first_startup:.2f}x); "
        f"chunk {chunk} resumed by {sorted(set(by_holder) - old_holders)}; test {time.monotonic() - started:.0f}s; "
        f"states {watch.states}"
    )
    assert recovered <= 2 * first_startup


def test_slurm_dry_run_checks_the_cluster_through_the_running_api_server(slurm_env, tmp_path):
    """`orch launch --dry-run` asks the API server that answers which infra `sky check` enabled:
    the local cluster is, a cloud is not; `~/.slurm/config` names the cluster."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    data = write_jsonl(tmp_path / "q.jsonl", [{"conversation": [{"role": "user", "content": "hi"}]}] * 4)
    run = ["--run", "dr", "--store", str(tmp_path / "store")]
    assert orch(env, "prepare", str(data), *run, "--num-chunks", "2").returncode == 0
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    args = ["launch", *run, "--model", "org/m", "--gpus", "L4", "--dry-run", "--out", str(tmp_path / "t")]
    on_prem = orch(env, *args, "--infra", f"slurm/{cluster}")
    assert on_prem.returncode == 0, on_prem.stderr
    assert "ok      sky check: enabled: slurm" in on_prem.stdout
    assert f"ok      slurm login: ~/.slurm/config names {cluster}" in on_prem.stdout
    overflow = orch(env, *args, "--infra", f"slurm/{cluster},aws")
    assert "missing sky check: not enabled: aws (enabled: slurm)" in overflow.stdout, overflow.stdout

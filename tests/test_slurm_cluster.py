"""Workers as SkyPilot managed jobs on a real Slurm cluster on this machine, a lost allocation recovered.

scripts/local-slurm starts a one-node Slurm cluster (munge, slurmctld, slurmd, an sshd on
127.0.0.1) and a SkyPilot API server whose jobs controllers run inside it; everything from orch's
CLI to the worker processes is the real thing: SkyPilot provisions with sbatch, links (or installs)
its runtime on the node, runs the task with srun, and its controller recovers the job when its
allocation is taken away (scancel), as it recovers a preempted spot machine. The store is a real
S3 server (SeaweedFS on 127.0.0.1). The recovery test's workers answer with the scripted engine
(ORCH_TEST_ENGINE=scripted in their task: the subject is the cluster, not the model); the probe
test runs vLLM on the CPU end to end.

The bed is cleaned after every test (its managed jobs and allocations cancelled) and brought down
after the module, on a failure, Ctrl-C or pytest-timeout's signal as on success; a run killed
outright (SIGKILL, SIGTERM) runs no finalizer, and the next `scripts/local-slurm up` cleans what it
left. A failing test writes its evidence (each job's states as seen, SkyPilot's controller logs,
squeue, orch status) to a file of its own under .cache/test-output/test_slurm_cluster/ (or
$ORCH_TEST_OUTPUT), and prints the path: pytest's temporary folders do not outlive the runs of
others on a shared machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.heartbeats import live_heartbeats, read_heartbeats
from orchestrator.core.records import read_manifest, read_marker
from orchestrator.core.store import open_store
from tests.support import events, s3servers
from tests.support.datasets import write_jsonl

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_engine,
    pytest.mark.cluster,
    pytest.mark.xdist_group("slurm"),
]  # its workers run vLLM (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
ORCH = [sys.executable, "-m", "orchestrator"]
SCRIPT = [*([] if os.geteuid() == 0 else ["sudo", "-n", "-E"]), str(ROOT / "scripts" / "local-slurm")]
#: The addresses SkyPilot's network check would reach: nothing of the bed may ever connect there.
PUBLIC_TEST_IPS = {"8.8.8.8", "1.1.1.1"}
#: Set in a worker's task: it answers with the scripted engine (tests' only; no vLLM), a word of every
#: running row per step of this many seconds.
SCRIPTED_ENGINE = {"ORCH_TEST_ENGINE": "scripted", "ORCH_TEST_ENGINE_STEP_S": "0.3"}
#: Where each test's evidence goes: kept after the run, whoever cleans the temporary folders.
EVIDENCE_DIR = Path(os.environ.get("ORCH_TEST_OUTPUT") or ROOT / ".cache" / "test-output") / "test_slurm_cluster"
#: The bed's own orch.yaml lines: its only node is this machine, so the loopback S3 store reaches it.
BED_RESOURCES = "resources:\n  gpus: []\n  cpus: 1\n  memory: 4\n  slurm: {single_machine: true}\n"


def bed(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    """The local cluster up for this module (scripts/local-slurm up, as root: it starts clean), and
    the settings SkyPilot's clients and the Slurm commands need; brought down after the module on
    any end pytest sees (scripts/local-slurm down, which cancels every managed job first)."""
    up = bed("up")
    if up.returncode != 0:
        bed("down")  # what it started before it failed
        pytest.fail(f"scripts/local-slurm up failed (it needs root and Debian's packages):\n{up.stdout}{up.stderr}")
    settings = dict(
        line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("export ")
    )
    keys = {"AWS_ACCESS_KEY_ID": s3servers.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3servers.SECRET_KEY}
    env = dict(os.environ, **settings, **keys)
    env.pop("SKYPILOT_API_SERVER_LOCAL_PORT", None)  # a client of the bed is never told its server is local
    try:
        yield env
    finally:
        # Kept up between runs while working on this file: cleaned, not stopped.
        bed("clean" if os.environ.get("ORCH_LOCAL_SLURM_KEEP") else "down")


class Evidence:
    """What a failing test leaves to read: a file in its temporary folder, written as the test goes
    (each job's states as first seen, the bed's process checks) and, on failure, completed with
    SkyPilot's controller logs, squeue and orch status."""

    def __init__(self, path: Path):
        self.path = path
        self.runs: list[tuple[dict[str, str], list[str]]] = []
        self.started = time.time()
        self._lock = threading.Lock()

    def note(self, line: str) -> None:
        with self._lock, self.path.open("a") as out:
            out.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    def watch_run(self, env: dict[str, str], run: list[str]) -> None:
        self.runs.append((env, run))

    def complete(self, env: dict[str, str]) -> None:
        """1. squeue and sinfo; 2. orch status of each run; 3. the tail of every SkyPilot
        controller and provision log written during the test. A section that cannot be had is
        said, and the others are written all the same."""
        commands = [("squeue", ["squeue", "-o", "%i %j %T %M %R"], env), ("sinfo", ["sinfo", "-N"], env)]
        commands += [(f"orch status {' '.join(run)}", [*ORCH, "status", *run], run_env) for run_env, run in self.runs]
        for title, command, where in commands:
            try:
                done = subprocess.run(
                    command, env=where, cwd=where.get("PWD"), capture_output=True, text=True, timeout=600
                )
                said = f"(exit {done.returncode})\n{done.stdout}{done.stderr}"
            except (OSError, subprocess.TimeoutExpired) as e:
                said = f"(not had: {e})\n"
            with self._lock, self.path.open("a") as out:
                out.write(f"\n== {title} {said}")
        with self._lock, self.path.open("a") as out:
            logs = Path(env["HOME"]) / "sky_logs"
            for log in sorted(logs.rglob("*.log"), key=lambda p: p.stat().st_mtime):
                if log.stat().st_mtime >= self.started and (
                    "jobs_controller" in log.parts or log.name == "provision.log"
                ):
                    lines = [x for x in log.read_text(errors="replace").splitlines() if "<sky-payload>" not in x]
                    out.write(f"\n== {log} (last 60 lines)\n" + "\n".join(lines[-60:]) + "\n")


@pytest.fixture
def evidence(slurm_env, request) -> Iterator[Evidence]:
    """The test's evidence file (its path printed at once); after the test, on failure, completed and
    its path printed again; and, on any end, every managed job and allocation the test left
    cancelled (the next test starts clean)."""
    EVIDENCE_DIR.mkdir(parents=True, exist_ok=True)
    found = Evidence(EVIDENCE_DIR / f"{request.node.name}-{time.strftime('%Y%m%d-%H%M%S')}.txt")
    found.note(f"{request.node.nodeid}, load {os.getloadavg()[0]:.0f}")
    print(f"\nevidence: {found.path}")
    failed_before = request.session.testsfailed
    try:
        yield found
        if request.session.testsfailed > failed_before:
            found.complete(slurm_env)
            print(f"\nevidence of the failure: {found.path}")
    finally:
        cleaned = bed("clean")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr


def orch(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """orch as a user runs it, from the project folder (env's PWD) that holds its orch.yaml."""
    return subprocess.run([*ORCH, *args], env=env, cwd=env["PWD"], capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, found: Any, timeout: float = 600, every: float = 2) -> Any:
    """An event of the cluster, looked for every `every` seconds (squeue and the store are asked each time)."""
    return events.wait_for(what, found, timeout, every=every)


def squeue(env: dict[str, str]) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True, check=True)
    return [tuple(line.split(" ", 1)) for line in out.stdout.splitlines() if line.strip()]  # type: ignore[misc]


def parts(store: Any, layout: RunLayout, worker: int | None = None, chunk: str | None = None) -> dict[str, str]:
    """Flushed output parts (of one worker's processes, of one chunk): key -> holder, the process
    that wrote it (`<worker>.<process>`, named in the key)."""
    prefix = layout.outputs_prefix(chunk) if chunk else layout.outputs_root
    found = {info.key: info.key.rsplit("/", 1)[1].rsplit("-", 1)[0] for info in store.list(prefix)}
    return {k: h for k, h in found.items() if worker is None or h.startswith(f"{worker}.")}


def bed_sky_processes(env: dict[str, str]) -> list[psutil.Process]:
    """The bed's SkyPilot API servers and jobs controllers (the processes that run SkyPilot's
    network check), with every process they started: any of them, whoever started it."""
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if (
                re.search(r"-m ?sky\.(server\.server|jobs\.controller)\b", cmd)
                and proc.environ().get("HOME") == env["HOME"]
            ):
                roots.append(proc)
        except psutil.Error:
            continue
    found = {p.pid: p for root in roots for p in (root, *_children(root))}
    return list(found.values())


def command_of(proc: psutil.Process) -> str:
    """Its command line; nothing for one that ended (or is a zombie) since it was found."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def unpatched(env: dict[str, str]) -> list[str]:
    """The bed's SkyPilot processes without the internet-check redirect (scripts/local-slurm's
    sitecustomize on PYTHONPATH, its URL the bed's server), and any connection to SkyPilot's public
    test addresses: each described; none is the only right answer."""
    probe = f"{env['ORCH_LOCAL_SLURM_DIR']}/sky-probe"
    wrong = []
    for proc in bed_sky_processes(env):
        try:
            environ, cmd = started_with(proc), " ".join(proc.cmdline())
        except psutil.Error:
            continue  # ended since it was found
        if probe not in environ.get("PYTHONPATH", "").split(":") or not environ.get("ORCH_LOCAL_SLURM_PROBE_URL"):
            wrong.append(f"pid {proc.pid} without the redirect: {cmd[:160]}")
    for conn in psutil.net_connections(kind="inet"):
        if conn.raddr and conn.raddr.ip in PUBLIC_TEST_IPS:
            wrong.append(f"pid {conn.pid} connects to {conn.raddr.ip}")
    return wrong


def started_with(proc: psutil.Process) -> dict[str, str]:
    """The environment a process started with. SkyPilot's executors rename themselves
    (setproctitle, which writes over the memory /proc shows as the environment): theirs reads
    empty, and is their parent's, which a forked or spawned child inherits."""
    while not (environ := proc.environ()):
        parent = proc.parent()
        if parent is None:
            return {}
        proc = parent
    return environ


class StatusWatch(threading.Thread):
    """The test's one watcher: `orch status --json`, as a user watching would, each worker's states
    in the order seen (with when), written to the evidence as they change; and, each time, the
    bed's SkyPilot processes checked for the redirect. It asks 10 s after a change and backs off to
    60 s while nothing changes (each `orch status` imports SkyPilot and asks its API server);
    `hurry()` asks again now, when the test expects a change."""

    FIRST_S, MOST_S = 10.0, 60.0

    def __init__(self, env: dict[str, str], run: list[str], evidence: Evidence):
        super().__init__(daemon=True)
        self.env, self.run_args, self.evidence = env, run, evidence
        self.states: dict[str, list[tuple[str, float]]] = {}
        #: Each worker's recoveries as `orch status` judged them (`spurious`, `machine lost`).
        self.recoveries: dict[str, set[str]] = {}
        #: Each worker's recovery count as last seen: a recovery between two looks (RECOVERING for
        #: less than a look takes on a loaded machine) shows only there.
        self.recovery_counts: dict[str, int] = {}
        self.workers: list[dict[str, Any]] = []
        self.unpatched: list[str] = []
        self.done = threading.Event()
        self._woken = threading.Event()
        evidence.watch_run(env, run)

    def run(self) -> None:
        pause = self.FIRST_S
        while not self.done.is_set():
            changed = self._look()
            pause = self.FIRST_S if changed else min(self.MOST_S, pause * 1.5)
            self._woken.wait(pause)
            self._woken.clear()

    def _look(self) -> bool:
        for problem in unpatched(self.env):
            if problem not in self.unpatched:
                self.unpatched.append(problem)
                self.evidence.note(f"SkyPilot process check: {problem}")
        status = orch(self.env, "status", *self.run_args, "--json")
        if status.returncode != 0:
            self.evidence.note(f"orch status failed: {status.stderr.strip()[-500:]}")
            return False
        doc = json.loads(status.stdout)
        if doc["backend_note"]:  # SkyPilot not asked this time: its states are unknown, not changed
            self.evidence.note(f"orch status: {doc['backend_note']}")
            return False
        self.workers = doc["workers"]
        changed = False
        for w in self.workers:
            if w["recovery"]:
                self.recoveries.setdefault(str(w["worker"]), set()).add(w["recovery"])
            seen = self.states.setdefault(str(w["worker"]), [])
            count_before = self.recovery_counts.get(str(w["worker"]))
            self.recovery_counts[str(w["worker"])] = w["recovery_count"]
            new_state = not seen or seen[-1][0] != w["state"]
            if new_state:
                seen.append((w["state"], time.monotonic()))
            if new_state or count_before != w["recovery_count"]:
                changed = True
                self.evidence.note(
                    f"{self.run_args[1]} worker {w['worker']}: {w['state']} (job {w['job_id']}, "
                    f"recoveries {w['recovery_count']} {w['recovery'] or ''}, {w['failure_reason'] or ''})"
                )
        return changed

    def hurry(self) -> None:
        self._woken.set()

    def stop(self) -> None:
        self.done.set()
        self.hurry()
        self.join(timeout=300)

    def sequence(self, worker: int) -> list[str]:
        return [state for state, _ in self.states.get(str(worker), [])]

    def recovered(self, worker: int) -> int:
        """SkyPilot's recovery count of the worker's job, as last seen."""
        return self.recovery_counts.get(str(worker), 0)

    def worker(self, i: int) -> dict[str, Any] | None:
        return next((w for w in self.workers if str(w["worker"]) == str(i)), None)


def holder_of(store: Any, layout: RunLayout, worker: int) -> str | None:
    """The process of `worker` that beat last (a new one after a recovery)."""
    beat = read_heartbeats(store, layout).get(str(worker))
    return beat.holder if beat else None


def lose_allocation(env: dict[str, str], job_name: str) -> float:
    """Take the job's Slurm allocation away at once, with no warning (SIGKILL to all in it), as a
    node lost underneath; returns when."""
    (alloc,) = [job for job, name in squeue(env) if name.startswith(job_name)]
    subprocess.run(["scancel", "--signal=KILL", "--full", alloc], env=env, check=True)
    return time.monotonic()


def mid_chunk(store: Any, layout: RunLayout, worker: int, gone: set[str]) -> str | None:
    """The chunk `worker`'s current process (not one of `gone`) answers, rows still left in it."""
    beat = read_heartbeats(store, layout).get(str(worker))
    if beat is None or beat.holder in gone or not beat.chunk or beat.chunk_rows - beat.chunk_rows_done < 20:
        return None
    return beat.chunk


def hold_still(store: Any, layout: RunLayout, worker: int, sig: int) -> list[psutil.Process]:
    """SIGSTOP or SIGCONT `worker`'s process tree (the node is this machine; its heartbeat names
    the pid)."""
    # Any process of it that has not exited: one held still before beats late, and is still there.
    beats = live_heartbeats(store, layout, now=time.time(), heartbeat_interval=3600)
    found = [psutil.Process(b.pid) for b in beats if b.worker == str(worker) and b.pid and psutil.pid_exists(b.pid)]
    procs = [p for proc in found for p in (proc, *proc.children(recursive=True))]
    for proc in procs:
        proc.send_signal(sig)
    return procs


def resume(held: list[psutil.Process]) -> None:
    """SIGCONT to the processes held still that are still there."""
    for proc in held:
        try:
            proc.send_signal(signal.SIGCONT)
        except psutil.Error:
            continue  # killed with its allocation


def new_part(store: Any, layout: RunLayout, worker: int, old_holders: set[str]) -> tuple[str, str] | None:
    """A flushed part of `worker` written by a process not in `old_holders`: (key, holder)."""
    return next(((k, h) for k, h in parts(store, layout, worker).items() if h not in old_holders), None)


def shared_model(env: dict[str, str]) -> Path:
    """The tiny model's weights where every node reads them (a cluster's shared disk), readable by
    the job's user."""
    model = Path(env["ORCH_LOCAL_SLURM_SHARED"]) / "tiny-llama"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(ROOT / ".cache" / "models" / "tiny-llama", model)
    for path in [model, *model.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return model


def prepare_questions(env: dict[str, str], run: list[str], rows: int, chunks: int, model: Path) -> None:
    """`orch prepare` of `rows` questions q0.. in `chunks` chunks, for the tiny model."""
    data = write_jsonl(
        Path(env["PWD"]) / "q.jsonl",
        [{"id": f"q{i}", "conversation": [{"role": "user", "content": f"Question {i}?"}]} for i in range(rows)],
    )
    args = ["--num-chunks", str(chunks), "--id-column", "id", "--model", str(model)]
    prepared = orch(env, "prepare", str(data), *run, *args)
    assert prepared.returncode == 0, prepared.stderr


def task_template(
    env: dict[str, str],
    where: Path,
    *,
    envs: dict[str, str] | None = None,
    setup_fails: bool = False,
    name: str = "task.yaml",
) -> Path:
    """A copy of orch's task template, `where`/`name` (no workdir: orch syncs its own source), with
    more settings for the worker or a set-up that fails at its second line. Its worker runs with
    an ordinary program's CPU share (the bed's bin/ordinary), outside the bed's own, which
    SkyPilot's job-status checks on the node keep (scripts/local-slurm: job steps inherit
    slurmd's): a worker busy on the CPU (vLLM) beside them would otherwise starve them past their
    30 s, and the bed would take more than its share of this shared machine."""
    template = yaml.safe_load((ROOT / "task_templates" / "worker.yaml").read_text())
    template["envs"] = {**template["envs"], **(envs or {})}
    ordinary = Path(env["ORCH_LOCAL_SLURM_DIR"]) / "bin" / "ordinary"
    template["run"] = template["run"].replace("exec ", f"exec {ordinary} ", 1)
    if setup_fails:
        template["setup"] = template["setup"].replace("set -e\n", "set -e\nno_such_command_orch_test --install\n", 1)
    path = where / name
    path.write_text(yaml.safe_dump(template))
    return path


def installs_on_nodes(env: dict[str, str], since: float) -> list[str]:
    """What SkyPilot's node set-up installed since then (uv's "Installed N packages"), per
    provision log: nothing, with the bed's prebuilt runtime."""
    logs = (Path(env["HOME"]) / "sky_logs").glob("sky-*/provision.log")
    return [
        f"{log}: {line.strip()}"
        for log in logs
        if log.stat().st_mtime >= since
        for line in log.read_text(errors="replace").splitlines()
        if re.search(r"Installed \d+ packages? in", line)
    ]


# The module's first test: the bed's `up` (a fresh clone: Debian's packages, SkyPilot's node runtime
# from PyPI, minutes) runs within its guard.
@pytest.mark.timeout(2400)
def test_slurm_dry_run_checks_the_cluster_and_exits_non_zero_while_a_prerequisite_is_missing(
    slurm_env, seaweedfs_server, tmp_path
):
    """`orch launch --dry-run` asks the API server that answers which infra `sky check` enabled (the
    local cluster is, a cloud is not), finds the cluster in `~/.slurm/config`, accepts the loopback
    store only because the spec says the login host is the cluster's only node, and exits 0 only
    when nothing is missing."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT), HF_TOKEN="hf_dry_run_placeholder")
    data = write_jsonl(tmp_path / "q.jsonl", [{"conversation": [{"role": "user", "content": "hi"}]}] * 4)
    run = ["--run", "dr", "--store", seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")]
    assert orch(env, "prepare", str(data), *run, "--num-chunks", "2").returncode == 0
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    args = ["launch", *run, "--model", "org/m", "--gpus", "L4", "--dry-run", "--out", str(tmp_path / "t")]
    (tmp_path / "orch.yaml").write_text("resources:\n  slurm: {single_machine: true}\n")
    on_prem = orch(env, *args, "--infra", f"slurm/{cluster}")
    assert on_prem.returncode == 0, on_prem.stdout + on_prem.stderr
    assert "ok      sky check: enabled: slurm" in on_prem.stdout
    assert f"ok      slurm login: ~/.slurm/config names {cluster}" in on_prem.stdout
    assert "ok      store reachable" in on_prem.stdout and "every prerequisite met." in on_prem.stdout
    overflow = orch(env, *args, "--infra", f"slurm/{cluster},aws")
    assert overflow.returncode == 1, overflow.stdout + overflow.stderr
    assert "missing sky check: not enabled: aws (enabled: slurm)" in overflow.stdout, overflow.stdout
    # A cloud machine cannot reach the loopback store either, whatever the cluster is.
    assert "ERROR 2 prerequisite(s) missing for a real launch: store reachable, sky check" in overflow.stderr, (
        overflow.stderr
    )
    (tmp_path / "orch.yaml").unlink()  # a real cluster's node is another machine: the loopback is its own
    elsewhere = orch(env, *args, "--infra", f"slurm/{cluster}")
    assert elsewhere.returncode == 1 and "missing store reachable: http://127.0.0.1:" in elsewhere.stdout, (
        elsewhere.stdout
    )


def test_local_slurm_clients_never_start_an_api_server_of_their_own(slurm_env, tmp_path, evidence):
    """With the bed's API server not answering (held still), a client of the bed (the `sky` CLI, as
    a user would run it) fails instead of starting a server of its own, which would lack the
    internet-check redirect: the endpoint is pinned in SkyPilot's config. Every SkyPilot process of
    the bed carries the redirect before and after."""
    env = dict(slurm_env, PWD=str(tmp_path))
    assert not unpatched(env), unpatched(env)
    servers = [p for p in bed_sky_processes(env) if "sky.server.server" in command_of(p)]
    (server,) = [p for p in servers if p.ppid() not in {s.pid for s in servers}]
    server.send_signal(signal.SIGSTOP)
    try:
        sky = str(Path(sys.executable).parent / "sky")
        asked = subprocess.run([sky, "jobs", "queue"], env=env, capture_output=True, text=True, timeout=600)
        after = [p.pid for p in bed_sky_processes(env) if "sky.server.server" in command_of(p)]
    finally:
        server.send_signal(signal.SIGCONT)
    evidence.note(f"sky jobs queue with the server held still: exit {asked.returncode}: {asked.stderr[-300:]}")
    assert asked.returncode != 0 and "Could not connect to SkyPilot API server" in asked.stdout + asked.stderr
    assert "Starting a local server" not in asked.stdout + asked.stderr
    assert sorted(after) == sorted(p.pid for p in servers), "a client started an API server of its own"
    assert not unpatched(env), unpatched(env)


# One start-up on SkyPilot and a recovery; the scripted engine answers (no vLLM start-up). Each
# wait below has its own bound and names what never came; this guard is only for a hang, sized
# for a machine at load 30-50.
@pytest.mark.timeout(2400)
def test_slurm_worker_survives_a_lost_allocation_and_cancel_leaves_nothing(
    slurm_env, seaweedfs_server, tmp_path, request, evidence
):
    """One worker as a managed job: its allocation taken away mid-chunk, SkyPilot's controller
    recovers it (RECOVERING, then RUNNING in a new allocation), a new worker process resumes the
    chunk from its checkpoints; every row once, `orch status` never calls that recovery spurious,
    and cancel leaves no allocation. One worker: a second would only add a start-up (the subject
    is the recovery) and would take the lost chunk over before the recovered worker came back."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "sl", "--store", store_uri]
    (tmp_path / "orch.yaml").write_text(
        "sampling:\n  max_tokens: 8\n  temperature: 0\n"
        "model:\n  engine_args: {max_num_seqs: 4}\n"
        # The lost process's lease outlives its recovery: its chunk waits for the worker's next
        # process (a worker takes back a lease of its own earlier process), not for an expiry.
        "workers:\n  heartbeat_interval: 1\n  checkpoint_interval: 1\n  lease_ttl: 900\n"
        + BED_RESOURCES
        + f"  worker_env: {(ROOT / '.venv-worker').resolve()}\n"
        "  job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 1}\n"
    )
    # The worker answers with the scripted engine (the subject is the cluster, not the model): 4
    # rows of 8 words at once, a word each 0.3 s, 1.7 rows/s: a chunk of 150 rows lasts 90 s, long
    # enough for the test to take its allocation away mid-chunk.
    template = task_template(env, tmp_path, envs=SCRIPTED_ENGINE)
    rows = 150
    prepare_questions(env, run, rows, chunks=1, model=shared_model(env))
    store, layout = open_store(store_uri), RunLayout("sl")
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    watch = StatusWatch(env, run, evidence)

    # 1. Launch the worker as a managed job on the Slurm cluster; it answers (first start-up).
    started, started_at = time.monotonic(), time.time()
    launch = ["launch", *run, "--backend", "skypilot", "--workers", "1", "--infra", f"slurm/{cluster}"]
    launched = orch(env, *launch, "--task-template", str(template))
    assert launched.returncode == 0, launched.stdout + launched.stderr
    watch.start()
    request.addfinalizer(watch.stop)
    wait_for("worker 0's process", lambda: holder_of(store, layout, 0), 1200)
    first_startup = time.monotonic() - started
    wait_for("worker 0's first rows", lambda: new_part(store, layout, 0, set()), 600)
    first_rows = time.monotonic() - started
    evidence.note(f"worker 0 process up {first_startup:.0f}s after launch, first rows {first_rows:.0f}s")

    # 2. Take its allocation away mid-chunk; SkyPilot's controller notices (RECOVERING) and recovers
    # the job in a new allocation, where a new worker 0 process resumes the chunk from its
    # checkpoints. A loss SkyPilot can call a preemption is of a job it has seen RUNNING (before
    # that, a lost allocation is a launch that failed, launched again as STARTING): the worker is
    # held still mid-chunk (SIGSTOP) until SkyPilot says RUNNING, which on a loaded machine can
    # come after the chunk would have ended.
    chunk = wait_for("worker 0 mid-chunk", lambda: mid_chunk(store, layout, 0, set()), every=0.5)
    held = hold_still(store, layout, 0, signal.SIGSTOP)
    request.addfinalizer(lambda: resume(held))
    watch.hurry()
    wait_for("SkyPilot's worker 0 RUNNING", lambda: watch.sequence(0)[-1:] == ["RUNNING"], 1200)
    gone = {str(holder_of(store, layout, 0))}  # worker 0's process lost with its allocation
    lost = lose_allocation(env, "orch-sl-w0")
    evidence.note(f"worker 0's allocation cancelled (SIGKILL) mid-chunk {chunk}")
    assert store.head(layout.done(chunk)) is None, f"chunk {chunk} finished before the loss: make it bigger"
    written_before = set(parts(store, layout, chunk=chunk).values())
    watch.hurry()
    # RECOVERING, or a recovery counted: at load 45 a look took a minute, and RECOVERING lasted less.
    wait_for("worker 0 recovering", lambda: "RECOVERING" in watch.sequence(0) or watch.recovered(0), 600)
    wait_for("worker 0 answering again", lambda: new_part(store, layout, 0, gone), 1200)
    recovery = time.monotonic() - lost
    evidence.note(f"worker 0 answering again {recovery:.0f}s after the loss")
    installed = installs_on_nodes(env, started_at)
    evidence.note(f"installed on the nodes since launch: {installed or 'nothing'}")
    assert not installed or os.environ.get("ORCH_LOCAL_SLURM_RUNTIME") == "node", installed

    # 3. It finishes; every row exactly once, and no flushed row redone: the lost chunk was resumed
    # from its checkpoints by the process that came after.
    watch.hurry()
    wait_for("the worker done", lambda: watch.sequence(0)[-1:] == ["SUCCEEDED"], 900)
    states = watch.sequence(0)  # RUNNING -> (RECOVERING, if a look fell within it) -> RUNNING -> SUCCEEDED
    assert "RUNNING" in states and states.count("RECOVERING") <= 1, watch.states
    w0 = watch.worker(0)
    assert w0 and w0["recovery_count"] == 1 and w0["cloud"] == "Slurm" and w0["region"] == cluster, w0
    # Its machine was lost, and `orch status` never called that recovery spurious.
    assert "spurious" not in watch.recoveries.get("0", set()), watch.recoveries
    out = tmp_path / "answers.jsonl"
    collected = orch(env, "collect", *run, "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"q{i}" for i in range(rows))
    flushed = [
        (json.loads(line)["custom_id"], key.split("/")[-2], holder)
        for key, holder in parts(store, layout).items()
        for line in store.get(key).data.decode().splitlines()
    ]
    assert sorted(i for i, _, _ in flushed) == sorted(ids), "a flushed row was answered again"
    writers = {holder for _, c, holder in flushed if c == chunk}
    assert writers - written_before and writers & written_before, f"chunk {chunk} was not resumed from its checkpoints"

    # 4. Cancel: no managed job live, no Slurm allocation left.
    cancelled = orch(env, "cancel", *run)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for("no Slurm allocation", lambda: not squeue(env) or None, 600)
    # SkyPilot's record of a job can still say CANCELLING after its allocation is gone (CI, load
    # 15-19): wait for its last word, as a user watching `orch status` would.
    ended = ("SUCCEEDED", "CANCELLED")
    watch.hurry()
    wait_for("the job ended", lambda: all(w["state"] in ended for w in watch.workers) or None, 600)
    watch.stop()
    assert all(w["state"] in ended for w in watch.workers), watch.workers
    assert not watch.unpatched + unpatched(env), watch.unpatched + unpatched(env)
    said = (
        f"slurm: worker 0 process up {first_startup:.0f}s after launch, first rows {first_rows:.0f}s; "
        f"allocation lost -> first rows again {recovery:.0f}s ({recovery / first_rows:.2f}x); "
        f"test {time.monotonic() - started:.0f}s; load {os.getloadavg()[0]:.0f}; states {watch.states}"
    )
    evidence.note(said)
    print(f"\n{said}")
    assert recovery <= 2 * first_rows


# A set-up that fails on the node: 2-5 minutes. (orch's relaunch of a failed job through SkyPilot
# is tests/test_skypilot_server.py's; here, what SkyPilot on Slurm says of a failed set-up.)
@pytest.mark.timeout(1500)
def test_slurm_worker_whose_setup_fails_is_said_in_skypilots_words_and_leaves_no_allocation(
    slurm_env, seaweedfs_server, tmp_path, evidence
):
    """A worker whose task's set-up fails at its second line, SkyPilot's own restarts off and no
    relaunch left: `orch launch --follow` stops, it and `orch status` say why in SkyPilot's words,
    and no allocation of it is left behind."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    template = task_template(env, tmp_path, setup_fails=True)
    (tmp_path / "orch.yaml").write_text(
        "workers:\n  retries: 0\n" + BED_RESOURCES + "  job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 0}\n"
    )
    data = write_jsonl(tmp_path / "q.jsonl", [{"id": "b", "conversation": [{"role": "user", "content": "hi"}]}])
    run = ["--run", "bad", "--store", seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")]
    model = shared_model(env)
    prepared = orch(env, "prepare", str(data), *run, "--num-chunks", "1", "--id-column", "id", "--model", str(model))
    assert prepared.returncode == 0, prepared.stderr
    evidence.watch_run(env, run)
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    args = ["launch", *run, "--backend", "skypilot", "--workers", "1", "--infra", f"slurm/{cluster}"]
    followed = orch(env, *args, "--task-template", str(template), "--follow", "--interval", "5", timeout=1200)
    said = followed.stdout + followed.stderr
    evidence.note(f"orch launch --follow: exit {followed.returncode}\n{said}")
    assert followed.returncode == 7 and "0 relaunches spent" in said and "Job failed (FAILED_SETUP)" in said, said
    shown = orch(env, "status", *run)
    assert "FAILED_SETUP" in shown.stdout and "worker 0 failed: Job failed (FAILED_SETUP)" in shown.stdout, shown.stdout
    wait_for("no allocation of the failed set-up", lambda: not [n for _, n in squeue(env) if "orch-bad" in n] or None)
    assert not unpatched(env), unpatched(env)


# One start-up on SkyPilot, the probe's with vLLM (the one test of the module that runs the real
# engine on the cluster); the run after it answers locally on the scripted engine: 4-8 minutes.
@pytest.mark.timeout(2400)
def test_slurm_probe_runs_on_a_skypilot_worker_and_its_rows_are_answered_once(
    slurm_env, seaweedfs_server, tmp_path, evidence
):
    """`orch estimate --probe` on the skypilot backend: the probe chunk answered by vLLM in a managed job
    on the cluster (a cluster of CPUs: one candidate, an allocation per worker), the forecast made from
    what it measured, and the run's worker then skips it: every row once."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "pr", "--store", store_uri]
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    (tmp_path / "orch.yaml").write_text(
        "backend: skypilot\n"
        "sampling:\n  max_tokens: 16\n  temperature: 0\n"
        "model:\n  engine_args: {max_num_seqs: 4}\n"
        "workers:\n  heartbeat_interval: 1\n" + BED_RESOURCES + f"  infra: [slurm/{cluster}]\n"
        f"  worker_env: {(ROOT / '.venv-worker').resolve()}\n"
    )
    with (tmp_path / "orch.yaml").open("a") as spec:
        spec.write(f"  task_template: {task_template(env, tmp_path)}\n")
    rows = 120
    prepare_questions(env, run, rows, chunks=3, model=shared_model(env))
    evidence.watch_run(env, run)
    estimated = orch(env, "estimate", *run, "--probe", "--probe-rows", "8", "--json", timeout=1800)
    assert estimated.returncode == 0, estimated.stderr
    assert "probe: worker 0 launched (" in estimated.stderr and "on the skypilot backend" in estimated.stderr
    doc = json.loads(estimated.stdout)
    assert doc["kind"] == "probe" and doc["probe"]["rows"] == 8 and doc["probe"]["hit_max_tokens"] == 8, doc["probe"]
    (candidate,) = doc["candidates"]
    assert candidate["gpu"] == doc["probe"]["accelerator"] and "one allocation each" in candidate["basis"], candidate
    assert 0 < candidate["duration_s"]["p10"] <= candidate["duration_s"]["p50"] <= candidate["duration_s"]["p90"]
    store, layout = open_store(store_uri), RunLayout("pr")
    probe_marker = read_marker(store, layout, doc["probe"]["chunk"])
    assert probe_marker is not None and probe_marker.rows == 8
    # The run: a local worker answers the other chunks (the scripted engine: vLLM and the cluster
    # were the probe's; the run skipping a probed chunk is orch's, whatever runs it), and the
    # probe's is left as it was.
    local = dict(env, ORCH_TEST_ENGINE="scripted", ORCH_TEST_ENGINE_STEP_S="0")
    followed = orch(local, "launch", *run, "--backend", "local", "--workers", "1", "--follow", "--interval", "2")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert read_marker(store, layout, doc["probe"]["chunk"]) == probe_marker
    out = tmp_path / "answers.jsonl"
    collected = orch(env, "collect", *run, "--out", str(out))
    assert collected.returncode == 0, collected.stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert ids == [f"q{i}" for i in range(rows)]
    assert sum(m.rows for m in (read_marker(store, layout, e.chunk) for e in read_manifest(store, layout)) if m) == rows


def managed_jobs(env: dict[str, str]) -> list[dict[str, Any]]:
    """The managed jobs SkyPilot's API server knows, finished or not, as `sky jobs queue` sees them."""
    code = (
        "import json, sky\n"
        "records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, all_users=True, fields=['job_id', 'job_name', 'status']))\n"
        "print(json.dumps([{'id': r.job_id, 'name': r.job_name, 'status': str(r.status.value)} for r in records]))\n"
    )
    asked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert asked.returncode == 0, asked.stderr
    return list(json.loads(asked.stdout.splitlines()[-1]))


# A launch to its allocation, and the bed brought down and up once: 3-6 minutes.
@pytest.mark.timeout(1800)
def test_local_slurm_up_after_a_run_left_its_workers_starts_with_no_managed_job(
    slurm_env, seaweedfs_server, tmp_path, evidence
):
    """A run killed before it cancelled its workers (pytest killed, a laptop closed) leaves managed
    jobs behind. `scripts/local-slurm up` on the bed still up cancels them (each allocation ends);
    `down` then `up` starts a server with no jobs database, so no controller finds a job to
    "recover" into a new allocation. Runs last: it stops and starts the bed."""
    env = dict(slurm_env, PWD=str(tmp_path), PYTHONPATH=str(ROOT))
    (tmp_path / "orch.yaml").write_text(BED_RESOURCES + f"  worker_env: {(ROOT / '.venv-worker').resolve()}\n")
    store_uri = seaweedfs_server.store_uri(seaweedfs_server.new_bucket(), "orch")
    run = ["--run", "gh", "--store", store_uri]
    prepare_questions(env, run, 20, chunks=1, model=shared_model(env))
    cluster = env["ORCH_LOCAL_SLURM_NAME"]
    launch = ["launch", *run, "--backend", "skypilot", "--workers", "1", "--infra", f"slurm/{cluster}"]
    template = task_template(env, tmp_path, envs=SCRIPTED_ENGINE)

    # 1. A worker launched, its allocation granted, and nothing cancelled (what a killed run leaves);
    # `up` on the bed still up cancels it and waits for its allocation to end.
    launched = orch(env, *launch, "--task-template", str(template))
    assert launched.returncode == 0, launched.stdout + launched.stderr
    wait_for("the worker's allocation", lambda: [n for _, n in squeue(env) if n.startswith("orch-gh-w0")] or None)
    evidence.note(f"left behind: {squeue(env)}")
    again = bed("up")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "cancelling 1 managed job(s) left unfinished" in again.stderr, again.stderr
    # The module's earlier tests' jobs are in the same server's records, ended: this run's, cancelled.
    left = [j["status"] for j in managed_jobs(env) if j["name"].startswith("orch-gh-")]
    assert not squeue(env) and left == ["CANCELLED"], managed_jobs(env)

    # 2. Brought down and up: the new server starts with no managed job at all (not even the
    # cancelled one), none allocated.
    down = bed("down")
    assert down.returncode == 0, down.stdout + down.stderr
    up = bed("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert managed_jobs(env) == [] and not squeue(env)
    assert not unpatched(env), unpatched(env)

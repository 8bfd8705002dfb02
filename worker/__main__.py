"""`python -m worker`: run one worker (or one replica per GPU set) of a run until no work is left.

Settings come from flags, else from the environment the launcher sets (ORCH_RUN, ORCH_STORE,
ORCH_WORKER, ORCH_SPOT); the spec comes from the run itself, frozen there by `orch prepare/plan`.
The last line on stdout is a JSON summary; progress goes to stderr.
Exit codes: orchestrator/core/exits.py (WorkerExit), one per summary status.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.core.errors import OrchError, RunNotFound, render_error
from orchestrator.core.exits import WorkerExit, WorkerStatus
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.model_source import MODEL_MOUNT_ENV, is_bucket_url, served_name
from orchestrator.core.pools import POOL_ENV, spec_for_pool
from orchestrator.core.protocol.adapters import fetch_adapters
from orchestrator.core.protocol.claims import pool_of
from orchestrator.core.records import read_plan
from orchestrator.core.spec import RunSpec
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import Store, open_store
from orchestrator.core.worker_ids import check_worker_id, planned_list, replica_id
from worker.replicas import run_replicas

if TYPE_CHECKING:
    from worker.engine import Engine
    from worker.runner import Worker


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--run", envvar="ORCH_RUN", required=True, help="run name [ORCH_RUN]")
@click.option("--store", envvar="ORCH_STORE", required=True, help="store URI [ORCH_STORE]")
@click.option("--worker", envvar="ORCH_WORKER", required=True, help="worker id: its list in the plan [ORCH_WORKER]")
@click.option(
    "--replicas",
    envvar="ORCH_REPLICAS",
    default="1",
    help="engine replicas on this machine, each on its own GPUs (data parallel); 'auto' = GPUs / tensor_parallel_size",
)
@click.option("--spot/--on-demand", "spot", envvar="ORCH_SPOT", default=None, help="what this machine is [ORCH_SPOT]")
@click.option(
    "--max-chunks",
    type=int,
    envvar="ORCH_MAX_CHUNKS",
    default=None,
    help="stop after this many chunks (a probe, tests, smoke runs) [ORCH_MAX_CHUNKS]",
)
@click.option("--checkpoint-interval", type=float, default=None, help="seconds between output flushes")
@click.option("--lease-ttl", type=float, default=None, help="seconds a lease lasts without renewal")
@click.option("--replica", type=int, default=None, hidden=True)
def main(
    run: str,
    store: str,
    worker: str,
    replicas: str,
    spot: bool | None,
    max_chunks: int | None,
    checkpoint_interval: float | None,
    lease_ttl: float | None,
    replica: int | None,
) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("orch.worker").setLevel(logging.INFO)  # orch's own few notes (the KV cache size)
    # vLLM logs every setting at INFO; a worker's log should show progress and problems.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        check_worker_id(str(worker))
        count = _replica_count(replicas, store, run, str(worker))
        if count > 1 and replica is None:
            sys.exit(run_replicas(count, _gpu_ids(), sys.argv[1:]))
        code = _run_one(run, store, str(worker), replica, spot, max_chunks, checkpoint_interval, lease_ttl)
    except OrchError as e:
        render_error(e)
        code = e.exit_code
    sys.exit(code)


def _run_one(
    run: str,
    store_uri: str,
    worker: str,
    replica: int | None,
    spot: bool | None,
    max_chunks: int | None,
    checkpoint_interval: float | None,
    lease_ttl: float | None,
) -> int:
    from orchestrator.core.protocol.outage import OutageTooLong
    from worker.heartbeat import WorkerIdentity
    from worker.runner import Shutdown, Worker

    spec = spec_from_run(open_store(store_uri, worker=True), run, checkpoint_interval, lease_ttl)
    # The run's own store settings (and ORCH_STORE_SETTINGS__* in the environment) from here on.
    store = open_store(store_uri, spec.store_settings, worker=True)
    pool = worker_pool(store, spec, worker)
    spec = spec_for_pool(spec, pool)
    cloud = _cluster_info()
    identity = WorkerIdentity.new(
        replica_id(worker, replica),
        own=planned_list(worker),
        spot=spot,
        cloud=cloud.get("cloud"),
        region=cloud.get("region"),
    )
    runner = Worker(store, spec, identity, lambda: _load_engine(store, spec), max_chunks=max_chunks, pool=pool)
    install_signal_handlers(runner)
    try:
        summary = runner.run()
        code: int = WorkerExit.DONE
    except Shutdown as stop:
        summary = runner.totals.summary(time.time() - runner.totals.started_at, stop.status)
        code = stop.status.exit_code
    except OutageTooLong as e:
        render_error(e)
        summary = runner.totals.summary(time.time() - runner.totals.started_at, WorkerStatus.STORE_UNREACHABLE)
        code = e.exit_code
    summary.update(worker=identity.worker, holder=identity.holder, accelerator=identity.accelerator)
    print(summary_line(summary), flush=True)
    return code


def _load_engine(store: Store, spec: RunSpec) -> Engine:
    """The engine, with the run's shipped LoRA adapters fetched into the local cache first."""
    from worker.engine import load_engine

    model = spec.model
    mounted = os.environ.get(MODEL_MOUNT_ENV)
    if mounted and is_bucket_url(model.name or ""):  # the task mounted the bucket (MOUNT_CACHED): read there
        # Answers keep the run's name for the model (the bucket's), never the mount's path.
        args = {"served_model_name": served_name(model.name or "", model.engine_args), **model.engine_args}
        model = model.model_copy(update={"name": mounted, "engine_args": args})
    if model.lora:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orch" / "adapters"
        model = model.model_copy(update={"lora": fetch_adapters(store, spec.layout, model.lora, cache)})
    return load_engine(model, spec.workers)


def worker_pool(store: Store, spec: RunSpec, worker: str) -> str | None:
    """A run of several models: the model this worker loads, ORCH_POOL (set by the launcher), else
    its planned list's (the plan is the one record of which worker serves which model)."""
    if not spec.models:
        return None
    given = os.environ.get(POOL_ENV)
    if given:
        return given
    plan = read_plan(store, spec.layout)
    pool = pool_of(plan, planned_list(worker)) if plan is not None else None
    if pool is None:
        raise RunNotFound(
            f"worker {worker} of run {spec.layout.run!r} (several models) has no model in the plan",
            hint=f"set {POOL_ENV} to one of {', '.join(spec.models)}, or plan the run again (orch plan)",
        )
    return pool


def spec_from_run(store: Store, run: str, checkpoint_interval: float | None, lease_ttl: float | None) -> RunSpec:
    """The spec frozen in the run, with this process's flags over it."""
    layout = RunLayout(run)
    stored = read_stored_spec(store, layout)
    if stored is None:
        raise RunNotFound(f"run {run!r} not found in {store.uri}", hint="prepare and plan it with orch first")
    flags: dict[str, Any] = {"run": run, "store": store.uri}
    if checkpoint_interval is not None:
        flags["workers.checkpoint_interval"] = checkpoint_interval
    if lease_ttl is not None:
        flags["workers.lease_ttl"] = lease_ttl
    spec = load_spec(None, flags, stored=stored[0], default_file=False)
    if not spec.model.name and not spec.models:
        raise RunNotFound(f"run {run!r} names no model", hint="pass --model to orch plan/launch")
    return spec


def _cluster_info() -> dict[str, Any]:
    """Cloud and region as SkyPilot tells its jobs (empty elsewhere)."""
    try:
        info: dict[str, Any] = json.loads(os.environ.get("SKYPILOT_CLUSTER_INFO", "{}"))
        return info
    except ValueError:
        return {}


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _replica_count(replicas: str, store_uri: str, run: str, worker: str) -> int:
    if replicas != "auto":
        try:
            count = int(replicas)
        except ValueError:
            raise OrchError(f"--replicas must be a number or 'auto', not {replicas!r}") from None
        if count < 1:
            raise OrchError("--replicas must be at least 1")
        return count
    store = open_store(store_uri)
    stored = read_stored_spec(store, RunLayout(run))
    if stored is None:
        return 1  # the run is not there: the worker says so itself
    spec = load_spec(None, {"run": run, "store": store_uri}, stored=stored[0], default_file=False)
    tp = spec_for_pool(spec, worker_pool(store, spec, worker)).model.tensor_parallel_size  # its own model's
    return max(1, len(_gpu_ids()) // tp)


def install_signal_handlers(worker: Worker) -> None:
    """SIGTERM (spot preemption notice, `orch cancel`) and SIGINT: flush finished rows, then stop."""

    def handler(_signum: int, _frame: Any) -> None:
        worker.request_stop()
        if worker.loading:
            # A stop is otherwise seen at the next engine step, and building the engine takes a
            # minute or more on a busy machine: past the grace `orch cancel` gives before SIGKILL.
            # Nothing is in the engine yet, so the build is abandoned. Not by raising here: an
            # exception thrown into vLLM's native start-up aborts the process (SIGABRT, measured).
            summary = worker.abandon_loading()
            print(summary_line(summary), flush=True)
            os._exit(WorkerExit.STOPPED)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def summary_line(summary: dict[str, Any]) -> str:
    """The JSON summary line: the last line on stdout, which the replicas' parent and schedulers read."""
    return json.dumps(summary, sort_keys=False)


if __name__ == "__main__":
    main()

"""Rendering a worker's SkyPilot task from task_templates/worker.yaml, and checking it with SkyPilot's own loader.

Rendering is structured (load the YAML, set fields, dump it), never string replacement, and pure:
the same spec and request give the same file. Secrets appear by name only, with null values;
their values are handed to SkyPilot in memory at launch.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends.base import LaunchRequest
from orchestrator.core.errors import BackendError
from orchestrator.core.exits import WorkerExit
from orchestrator.core.model_source import MODEL_MOUNT, MODEL_MOUNT_ENV, is_bucket_url
from orchestrator.core.pools import spec_for_pool
from orchestrator.core.spec import ResourcesSpec, RunSpec, is_on_prem

#: orch's source: what a worker's task syncs to its machine (`workdir`) and runs `python -m worker` from.
ORCH_SOURCE = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATE = ORCH_SOURCE / "task_templates" / "worker.yaml"


def load_template(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The task template (spec resources.task_template, else orch's own), with its relative local
    paths (workdir, file mount sources) made absolute against the template's own directory: `orch
    launch` runs from the user's project, not from here. With no `workdir` the task syncs orch's
    source; a `workdir` that does not hold it is refused (a copy of the template elsewhere would
    sync its whole folder to every worker, and the worker would not start from it)."""
    path = Path(path or DEFAULT_TEMPLATE)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise BackendError(f"cannot read the task template: {e}", where=str(path)) from None
    if not isinstance(doc, dict):
        raise BackendError("a task template is a YAML mapping", where=str(path))
    base = path.absolute().parent
    if "workdir" not in doc:
        doc["workdir"] = str(ORCH_SOURCE)
    elif isinstance(doc["workdir"], str):
        doc["workdir"] = _local_path(doc["workdir"], base)
        _check_orch_source(doc["workdir"], where=str(path))
    mounts = doc.get("file_mounts")
    if isinstance(mounts, dict):
        for target, source in mounts.items():
            if isinstance(source, str):
                mounts[target] = _local_path(source, base)
            elif isinstance(source, dict) and isinstance(source.get("source"), str):
                source["source"] = _local_path(source["source"], base)
    return doc


def _check_orch_source(workdir: str, *, where: str) -> None:
    if "://" in workdir or (Path(workdir).expanduser() / "worker" / "__main__.py").is_file():
        return
    raise BackendError(
        f"workdir {workdir} does not hold orch's source (worker/__main__.py): SkyPilot would copy all of it "
        "to every worker, and `python -m worker` would not start there",
        where=where,
        hint=f"remove `workdir:` from the template: orch's own source ({ORCH_SOURCE}) is synced",
    )


def _local_path(value: str, base: Path) -> str:
    """A relative local path, absolute against `base`; URLs, absolute and home paths as written."""
    if "://" in value or value.startswith(("~", "/")):
        return value
    return os.path.normpath(base / value)


def render_worker_task(template: dict[str, Any], spec: RunSpec, request: LaunchRequest) -> dict[str, Any]:
    task = copy.deepcopy(template)
    task["name"] = request.name
    spec = spec_for_pool(spec, request.model)  # a run of several models: this worker's model and machines
    if request.gpus is not None:  # a probe of one candidate GPU type
        spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": list(request.gpus)})})
    r = spec.resources
    envs = dict(task.get("envs") or {})
    envs.update(request.envs)
    if request.use_spot is not None:
        envs["ORCH_SPOT"] = "1" if request.use_spot else "0"
    # What the template's setup installs (or finds already there) and the run line starts.
    envs["ORCH_WORKER_EXTRA"] = "worker" if r.gpus else "worker-cpu"
    if r.worker_env:
        envs["ORCH_WORKER_ENV"] = r.worker_env
    if not r.gpus and r.cpus:
        envs["OMP_NUM_THREADS"] = str(r.cpus)  # vLLM-CPU sizes its threads for the machine, not the allocation
    if is_bucket_url(spec.model.name or ""):
        # Weights from the bucket, cached on the machine's disk as they are read: a restart on the
        # same machine reads them from there, never from the hub. The worker's engine loads the mount.
        mounts = dict(task.get("file_mounts") or {})
        mounts[MODEL_MOUNT] = {"source": spec.model.name, "mode": "MOUNT_CACHED"}
        task["file_mounts"] = mounts
        envs[MODEL_MOUNT_ENV] = MODEL_MOUNT
    task["envs"] = envs
    task["resources"] = _resources(dict(task.get("resources") or {}), spec, request.use_spot, request.zones)
    if r.slurm.time:
        # A task-level override of SkyPilot's config (allowed for slurm.sbatch_options): the
        # allocation's wall-time limit, read only where the worker lands on a Slurm cluster.
        config = dict(task.get("config") or {})
        slurm = dict(config.get("slurm") or {})
        slurm["sbatch_options"] = {**(slurm.get("sbatch_options") or {}), "time": r.slurm.time}
        task["config"] = {**config, "slurm": slurm}
    # Only names, and only of secrets we can fill: a null secret left unfilled fails the launch.
    task["secrets"] = {name: None for name in request.secrets}
    if not task["secrets"]:
        task.pop("secrets")
    return task


def _resources(
    resources: dict[str, Any], spec: RunSpec, use_spot: bool | None, ranked: Sequence[str] = ()
) -> dict[str, Any]:
    """The task's resources: the template's, with the spec's machine, places and recovery set.

    One place (or none): the GPU candidates as one set, every GPU x {spot, on-demand} for SkyPilot
    to take the cheapest with capacity. Several places (`infra: [slurm/x, aws]`): an `ordered` list,
    tried in its order: the on-prem clusters first (no spot market there), each with the GPUs in
    the spec's order; then every cloud place's spot candidates, then their on-demand ones, places
    as written and GPUs in the spec's order: on-demand only once no cloud has spot capacity.
    `zones`: an `ordered` list, spot in each zone in the ranked order (best first), then on-demand
    in the same order. On a Slurm cluster a GPU is asked for by the cluster's own name where
    `resources.slurm.gpu_names` gives one."""
    r = spec.resources
    written = {
        k: v for k, v in resources.items() if k not in ("accelerators", "any_of", "ordered", "use_spot", "infra")
    }
    resources = {}
    spot_choices = [s for s, allowed in ((True, r.spot), (False, r.on_demand)) if allowed]
    if use_spot is not None:
        spot_choices = [use_spot]
    places = list(r.infra) or ([f"{r.cloud}/{r.region}" if r.region else r.cloud] if r.cloud else [])
    if r.zones:
        zones = list(ranked) or r.zones
        resources["ordered"] = [
            {"infra": zone, **gpu, "use_spot": spot}
            for spot in spot_choices
            for zone in zones
            for gpu in _gpu_choices(r, zone)
        ]
    elif len(places) > 1:
        clouds = [place for place in places if not is_on_prem(place)]
        resources["ordered"] = [
            {"infra": place, **gpu} for place in places if is_on_prem(place) for gpu in _gpu_choices(r, place)
        ] + [
            {"infra": place, **gpu, "use_spot": spot}
            for spot in spot_choices
            for place in clouds
            for gpu in _gpu_choices(r, place)
        ]
    else:
        if places:
            resources["infra"] = places[0]
        if r.gpus:
            (choice,) = _gpu_choices(r, places[0] if places else "", one_set=True)
            resources.update(choice)
        on_prem = bool(places) and is_on_prem(places[0])  # no spot market on one's own machines
        if not on_prem and len(spot_choices) == 2:
            resources["any_of"] = [{"use_spot": True}, {"use_spot": False}]
        elif not on_prem:
            resources["use_spot"] = spot_choices[0]
    resources.update(written)
    for key, value in (("cpus", r.cpus), ("memory", r.memory), ("disk_size", r.disk_size), ("image_id", r.image_id)):
        if value:
            resources[key] = value
    resources["job_recovery"] = {
        "strategy": r.job_recovery.strategy,
        "max_restarts_on_errors": r.job_recovery.max_restarts_on_errors,
        # A worker that outwaited a store outage exits 75: started again without spending a restart.
        "recover_on_exit_codes": [WorkerExit.STORE_UNREACHABLE.value],
    }
    return resources


def _gpu_choices(r: ResourcesSpec, place: str, *, one_set: bool = False) -> list[dict[str, Any]]:
    """`accelerators` entries for one place: one per GPU in the spec's order (or all in one set),
    each named as the place knows it (a Slurm cluster's GRES type from resources.slurm.gpu_names)."""
    names = r.slurm.gpu_names if place.lower().startswith("slurm") else {}
    counts = {names.get(gpu, gpu): r.gpus_per_worker for gpu in r.gpus}
    if one_set:
        return [{"accelerators": counts}]
    return [{"accelerators": {name: count}} for name, count in counts.items()] or [{}]


class _TaskDumper(yaml.SafeDumper):
    """Multi-line strings (setup, run) as `|` blocks, the way people write them."""


_TaskDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def to_yaml(task: dict[str, Any]) -> str:
    return yaml.dump(task, Dumper=_TaskDumper, sort_keys=False, default_flow_style=False)


def load_task(text: str, *, secrets: Iterable[tuple[str, str]] = (), where: str = "task") -> Any:
    """The sky.Task SkyPilot's own loader makes of the YAML (offline), secrets attached in memory.

    1. No duplicate keys; 2. the chain-DAG loader (misspelled keys, wrong types, storage modes);
    3. SkyPilot's defaults for a managed-job launch; 4. the recovery strategy exists.
    """
    from sky import JOBS_RECOVERY_STRATEGY_REGISTRY
    from sky.utils import dag_utils, yaml_utils

    try:
        yaml_utils.check_no_duplicate_keys(text)
        dag = dag_utils.load_chain_dag_from_yaml_str(text, secrets_overrides=list(secrets) or None)
        dag_utils.fill_default_config_in_dag_for_job_launch(dag)
        strategy = ((yaml.safe_load(text).get("resources") or {}).get("job_recovery") or {}).get("strategy")
        if strategy:
            JOBS_RECOVERY_STRATEGY_REGISTRY.from_str(strategy)
    except Exception as e:  # SkyPilot's messages say which key is wrong
        raise BackendError(
            f"SkyPilot refuses the task: {e}",
            where=where,
            hint="fix task_templates/worker.yaml (or the spec's resources)",
        ) from None
    if len(dag.tasks) != 1:
        raise BackendError("a worker task is one SkyPilot task", where=where)
    return dag.tasks[0]


def write_dry_run(
    spec: RunSpec,
    requests: Sequence[LaunchRequest],
    out_dir: str | os.PathLike[str],
    template: dict[str, Any] | None = None,
) -> list[Path]:
    """Render and check every worker's task, write worker-<i>.yaml, launch nothing."""
    template = template or load_template(spec.resources.task_template)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for request in requests:
        text = to_yaml(render_worker_task(template, spec, request))
        path = out / f"worker-{request.worker}.yaml"
        load_task(text, where=str(path))
        path.write_text(text)
        paths.append(path)
    return paths

"""SkyPilot tasks: rendered from the template, checked by SkyPilot's own loader, secrets never written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.skypilot_checks import prerequisites
from orchestrator.backends.skypilot_render import load_task, load_template, render_worker_task, to_yaml
from orchestrator.cli import main
from orchestrator.core.errors import BackendError, SpecError
from orchestrator.core.spec_load import load_spec

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parents[1]
CANARY = "orch-secret-canary-7f3a9"


@pytest.fixture(autouse=True)
def sky_home(tmp_path_factory, monkeypatch):
    """Importing sky writes ~/.sky: keep it in a temporary HOME."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


def request(worker=3, secrets=None, use_spot=None):
    envs = {
        "ORCH_RUN": "lmsys",
        "ORCH_STORE": "r2://bucket/orch",
        "ORCH_WORKER": str(worker),
        "ORCH_WORKER_LIST": f"workers/{worker}.txt",
    }
    return LaunchRequest(
        worker=worker,
        name=f"orch-lmsys-w{worker}",
        envs=envs,
        secrets=secrets or {"HF_TOKEN": "x", "R2_ACCESS_KEY_ID": "y"},
        use_spot=use_spot,
    )


SPECS = {
    "default": {},
    "spot-a100-gcp": {
        "resources.gpus": ["A100", "A100-80GB"],
        "resources.on_demand": False,
        "resources.cloud": "gcp",
        "resources.region": "us-central1",
        "resources.disk_size": 512,
        "resources.job_recovery.strategy": "FAILOVER",
    },
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_rendered_task_matches_golden_and_skypilot_accepts_it(name):
    spec = load_spec(None, {"run": "lmsys", "store": "r2://bucket/orch", **SPECS[name]}, env={}, default_file=False)
    text = to_yaml(render_worker_task(load_template(), spec, request()))
    text = text.replace(f"workdir: {ROOT}\n", "workdir: /path/to/orch\n")  # the checkout's place varies
    golden = GOLDEN / f"worker-{name}.yaml"
    if os.environ.get("ORCH_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendering changed; if intended: ORCH_UPDATE_GOLDEN=1 pytest {__file__}"
    task = load_task(text)
    assert task.envs["ORCH_WORKER"] == "3" and task.name == "orch-lmsys-w3"
    resources = {str(r) for r in task.resources}
    if name == "default":
        assert len(resources) == 10  # 5 GPUs x {spot, on-demand}
    else:
        assert len(resources) == 2 and all("Spot" in r for r in resources)


def test_render_narrows_to_spot_or_on_demand_when_the_request_says_so():
    spec = load_spec(None, {"run": "r"}, env={}, default_file=False)
    task = render_worker_task(load_template(), spec, request(use_spot=False))
    assert task["resources"]["use_spot"] is False and "any_of" not in task["resources"]
    assert task["envs"]["ORCH_SPOT"] == "0"
    assert len(load_task(to_yaml(task)).resources) == 5


def test_template_paths_are_relative_to_the_template_not_to_where_orch_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a user's project folder, far from orch's source
    assert load_template()["workdir"] == str(ROOT)  # what the worker's setup installs from
    (tmp_path / "mine").mkdir()
    (tmp_path / "src" / "worker").mkdir(parents=True)  # a checkout of orch's source of one's own
    (tmp_path / "src" / "worker" / "__main__.py").write_text("")
    (tmp_path / "mine" / "task.yaml").write_text(
        "workdir: ../src\nfile_mounts:\n  /data: data\n  /abs: /srv/x\n  /bucket: s3://b/p\n"
        "  /store: {source: cache, mode: COPY}\nrun: echo\n"
    )
    template = load_template(tmp_path / "mine" / "task.yaml")
    assert template["workdir"] == str(tmp_path / "src")
    assert template["file_mounts"] == {
        "/data": str(tmp_path / "mine" / "data"),
        "/abs": "/srv/x",
        "/bucket": "s3://b/p",
        "/store": {"source": str(tmp_path / "mine" / "cache"), "mode": "COPY"},
    }


def test_a_template_copied_elsewhere_syncs_orchs_source_never_its_own_folder(tmp_path, monkeypatch, capsys):
    """`orch launch --task-template FILE`: a copy of worker.yaml in a project folder, edited, renders
    every worker (and is kept with the run for its relaunches); the task syncs orch's source, not the
    copy's folder; a `workdir` that does not hold orch's source is refused before anything is sent."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", "1")  # none answers there: never start one
    template = yaml.safe_load((ROOT / "task_templates" / "worker.yaml").read_text())
    template["resources"]["disk_size"] = 64
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(template))
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n' * 2)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "tt", "--store", store, "--num-chunks", "1"]) == 0
    args = ["launch", "--run", "tt", "--store", store, "--model", "m", "--dry-run", "--out", str(tmp_path / "t")]
    assert main([*args, "--task-template", "task.yaml"]) == 1  # prerequisites missing here, the task written
    doc = yaml.safe_load((tmp_path / "t" / "worker-0.yaml").read_text())
    assert doc["workdir"] == str(ROOT) and doc["resources"]["disk_size"] == 64
    spec = load_spec(None, {"run": "tt", "resources.task_template": str(tmp_path / "task.yaml")}, env={})
    assert spec.resources.task_template == str(tmp_path / "task.yaml")

    template["workdir"] = ".."  # as in orch's own folder, but the copy's folder's parent is not orch
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(template))
    capsys.readouterr()
    assert main([*args, "--task-template", "task.yaml"]) == 6
    err = capsys.readouterr().err
    assert f"ERROR {tmp_path / 'task.yaml'}: workdir {tmp_path.parent} does not hold orch's source" in err
    assert "remove `workdir:` from the template" in err


def test_render_keeps_what_the_user_wrote_in_the_template():
    template = load_template()
    template["resources"]["image_id"] = "docker:vllm/vllm-openai:latest"
    template["file_mounts"] = {"/data": "s3://my-bucket/data"}
    spec = load_spec(None, {"run": "r"}, env={}, default_file=False)
    task = render_worker_task(template, spec, request())
    assert task["resources"]["image_id"] == "docker:vllm/vllm-openai:latest"
    assert task["file_mounts"] == {"/data": "s3://my-bucket/data"}
    assert "uv pip install" in task["setup"] and '/bin/python" -m worker' in task["run"]


def test_skypilot_loader_catches_a_misspelled_template_key():
    template = load_template()
    template["resources"]["disk_sze"] = 100
    spec = load_spec(None, {"run": "r"}, env={}, default_file=False)
    with pytest.raises(BackendError, match="disk_size"):
        load_task(to_yaml(render_worker_task(template, spec, request())))


def test_dry_run_writes_checked_tasks_and_never_a_secret(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "R2_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, CANARY)
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n' * 8)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "dr", "--store", store, "--num-chunks", "4"]) == 0
    out_dir = tmp_path / "tasks"
    assert (
        main(
            [
                "launch",
                "--run",
                "dr",
                "--store",
                store,
                "--model",
                "m",
                "--workers",
                "4",
                "--dry-run",
                "--out",
                str(out_dir),
            ]
        )
        == 1  # written; prerequisites missing here (a local store, no API server)
    )
    files = sorted(out_dir.glob("*.yaml"))
    assert [f.name for f in files] == [f"worker-{i}.yaml" for i in range(4)]
    for f in files:
        doc = yaml.safe_load(f.read_text())
        assert {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "R2_SECRET_ACCESS_KEY"} <= set(doc["secrets"])
        assert set(doc["secrets"].values()) == {None}  # names only
        load_task(f.read_text())
    printed = capsys.readouterr()
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert CANARY not in printed.out + printed.err
    assert not [p for p in everything if CANARY.encode() in p.read_bytes()]


def test_dry_run_changes_nothing_in_the_run(tmp_path, monkeypatch, capsys):
    """`orch launch --dry-run` reads and renders: the stored spec (backend, GPUs, spot), the plan and
    the jobs stay as they were, so the next plain launch goes where it went before."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n' * 8)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "dr", "--store", store, "--num-chunks", "4"]) == 0

    def snapshot():
        return {p: p.read_bytes() for p in Path(store).rglob("*") if p.is_file() and ".orch-" not in str(p)}

    before = snapshot()
    args = ["--gpus", "A100", "--spot", "--workers", "3", "--model", "m", "--out", str(tmp_path / "tasks")]
    assert main(["launch", "--run", "dr", "--store", store, "--dry-run", *args]) == 1  # missing here: a local store
    assert "nothing launched" in capsys.readouterr().out
    assert snapshot() == before
    spec = yaml.safe_load((Path(store) / "runs/dr/spec.yaml").read_text())["spec"]
    assert spec["backend"] == "local" and spec["resources"]["gpus"] != ["A100"] and spec["resources"]["on_demand"]


def test_render_puts_cpu_workers_on_a_slurm_cluster_with_no_spot_and_a_ready_environment():
    flags = {"run": "r", "resources.infra": "slurm/orchlocal", "resources.gpus": [], "resources.cpus": 2}
    spec = load_spec(
        None, {**flags, "resources.memory": 4, "resources.worker_env": "/shared/env"}, env={}, default_file=False
    )
    task = render_worker_task(load_template(), spec, request())
    resources = task["resources"]
    assert resources["infra"] == "slurm/orchlocal" and resources["cpus"] == 2 and resources["memory"] == 4
    assert not {"accelerators", "any_of", "use_spot", "ordered"} & set(resources)
    assert task["envs"]["ORCH_WORKER_ENV"] == "/shared/env" and task["envs"]["ORCH_WORKER_EXTRA"] == "worker-cpu"
    assert task["envs"]["OMP_NUM_THREADS"] == "2"
    (sky_resources,) = load_task(to_yaml(task)).resources
    assert str(sky_resources.cloud) == "Slurm" and sky_resources.region == "orchlocal"
    assert not sky_resources.use_spot and sky_resources.accelerators is None


def test_render_tries_the_slurm_cluster_first_then_every_cloud_spot_then_on_demand():
    """`--infra slurm/onprem,aws,gcp --gpus L4,A100`: the cluster (no spot market) first, then spot on
    each cloud, then on-demand on each: an on-demand machine only once no cloud has a spot one.
    SkyPilot's own loader keeps that order."""
    flags = {"run": "r", "resources.infra": ["slurm/onprem", "aws", "gcp"], "resources.gpus": ["L4", "A100"]}
    spec = load_spec(None, flags, env={}, default_file=False)
    task = render_worker_task(load_template(), spec, request())
    expected = [("slurm/onprem", "L4", None), ("slurm/onprem", "A100", None)] + [
        (cloud, gpu, spot) for spot in (True, False) for cloud in ("aws", "gcp") for gpu in ("L4", "A100")
    ]
    assert [(o["infra"], *o["accelerators"], o.get("use_spot")) for o in task["resources"]["ordered"]] == expected
    loaded = load_task(to_yaml(task))
    candidates = list(loaded.resources)  # SkyPilot keeps an ordered preference as a list
    assert isinstance(loaded.resources, list) and len(candidates) == 10
    assert [(str(c.cloud), c.use_spot) for c in candidates] == [
        (
            {"slurm/onprem": "Slurm", "aws": "AWS", "gcp": "GCP"}[infra],
            bool(spot),
        )
        for infra, _, spot in expected
    ]


def test_render_names_gpus_as_the_slurm_cluster_does_and_asks_for_its_wall_time():
    """`resources.slurm.gpu_names` renames a GPU on Slurm only (the cloud keeps SkyPilot's name), and
    `resources.slurm.time` becomes the allocation's sbatch --time, through the task's own SkyPilot
    config; SkyPilot's loader accepts both. A time Slurm would not read is refused by the spec."""
    flags = {
        "run": "r",
        "resources.infra": ["slurm/onprem", "aws"],
        "resources.gpus": ["A100-80GB"],
        "resources.slurm.gpu_names": {"A100-80GB": "a100_80g"},
        "resources.slurm.time": "12:00:00",
    }
    spec = load_spec(None, flags, env={}, default_file=False)
    task = render_worker_task(load_template(), spec, request())
    assert [o["accelerators"] for o in task["resources"]["ordered"]] == [
        {"a100_80g": 1},
        {"A100-80GB": 1},
        {"A100-80GB": 1},
    ]
    assert task["config"] == {"slurm": {"sbatch_options": {"time": "12:00:00"}}}
    loaded = load_task(to_yaml(task))
    assert [c.accelerators for c in loaded.resources] == [{"a100_80g": 1}, {"A100-80GB": 1}, {"A100-80GB": 1}]
    one = load_spec(None, {**flags, "resources.infra": "slurm/onprem"}, env={}, default_file=False)
    assert render_worker_task(load_template(), one, request())["resources"]["accelerators"] == {"a100_80g": 1}
    for fine in ("90", "2-00:00:00", "1-12", "30:00", "UNLIMITED"):
        load_spec(None, {**flags, "resources.slurm.time": fine}, env={}, default_file=False)
    with pytest.raises(SpecError, match=r"resources.slurm.time.*'12h' is not a Slurm time"):
        load_spec(None, {**flags, "resources.slurm.time": "12h"}, env={}, default_file=False)


def test_store_check_refuses_a_loopback_endpoint_unless_the_login_host_is_the_only_node():
    """A store at 127.0.0.1 is this machine: a cloud machine, or a Slurm compute node (another
    machine, whose 127.0.0.1 is itself), cannot reach it; only a cluster whose login host is its
    only node can, when the spec says so."""
    store = "s3://b/p?endpoint=http://127.0.0.1:8333"

    def reachable(**flags):
        spec = load_spec(None, {"run": "r", "store": store, **flags}, env={}, default_file=False)
        (check,) = [c for c in prerequisites(spec, {}) if c.name == "store reachable"]
        return check

    refused = reachable(**{"resources.infra": "slurm/onprem"})
    assert not refused.ok and "a worker on slurm/onprem's machines cannot reach it" in refused.detail
    assert "resources.slurm.single_machine: true" in refused.detail
    assert reachable(**{"resources.infra": "slurm/onprem", "resources.slurm.single_machine": True}).ok
    mixed = {"resources.infra": ["slurm/onprem", "aws"], "resources.slurm.single_machine": True}
    assert not reachable(**mixed).ok and "a cloud" in reachable(**mixed).detail
    assert not reachable(**{"resources.infra": "k8s/lab", "resources.slurm.single_machine": True}).ok


def test_dry_run_renders_slurm_first_and_says_which_prerequisites_are_missing(tmp_path, monkeypatch, capsys):
    """`--infra slurm/onprem,aws`: one task SkyPilot's loader accepts, the cluster tried first; and
    each prerequisite a real launch needs, checked from here (no API server started for it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", "1")  # none answers there: never start one
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n' * 4)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "op", "--store", store, "--num-chunks", "2"]) == 0
    args = ["--run", "op", "--store", store, "--model", "org/model", "--gpus", "L4", "--dry-run"]
    assert main(["launch", *args, "--infra", "slurm/onprem,aws", "--out", str(tmp_path / "t")]) == 1
    said = capsys.readouterr()
    printed = said.out
    task = load_task((tmp_path / "t" / "worker-0.yaml").read_text())
    assert [(str(r.cloud), r.use_spot) for r in task.resources] == [("Slurm", False), ("AWS", True), ("AWS", False)]
    assert "missing slurm login: no ~/.slurm/config" in printed
    assert "missing hub token: HF_TOKEN not set" in printed and "missing sky check: no SkyPilot API server" in printed
    # and the store: a local directory. A script gates a real launch on the exit status.
    assert (
        "ERROR 4 prerequisite(s) missing for a real launch: store credentials, slurm login, sky check, hub token"
        in (said.err)
    )

    (Path(os.environ["HOME"]) / ".slurm").mkdir()
    (Path(os.environ["HOME"]) / ".slurm" / "config").write_text("Host onprem\n  HostName 10.0.0.1\n  User me\n")
    monkeypatch.setenv("HF_TOKEN", CANARY)
    assert main(["launch", *args, "--infra", "slurm/onprem", "--out", str(tmp_path / "t2")]) == 1
    printed = capsys.readouterr().out
    assert "ok      slurm login: ~/.slurm/config names onprem" in printed and "ok      hub token" in printed
    assert CANARY not in printed


def test_spot_only_on_a_slurm_cluster_is_refused_where_it_is_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n')
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "sp", "--store", store, "--num-chunks", "1"]) == 0
    args = ["launch", "--run", "sp", "--store", store, "--model", "m", "--dry-run", "--out", str(tmp_path / "t")]
    assert main([*args, "--infra", "slurm/c", "--spot"]) == 2
    assert "slurm/c has no spot market" in capsys.readouterr().err


def test_dry_run_mounts_a_bucket_model_cached_and_points_the_worker_at_it(tmp_path, monkeypatch, capsys):
    """`--model s3://bucket/models/llama`: the task mounts the bucket MOUNT_CACHED (read once per
    machine, not from the hub on every restart), SkyPilot's loader accepts it, and the worker's
    engine is told the mount's path; a local worker, which cannot read a bucket, is refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", "1")  # none answers there: never start one
    (tmp_path / "d.jsonl").write_text('{"conversation": [{"role": "user", "content": "hi"}]}\n' * 2)
    store = str(tmp_path / "store")
    assert main(["prepare", str(tmp_path / "d.jsonl"), "--run", "b", "--store", store, "--num-chunks", "1"]) == 0
    bucket = "s3://my-weights/models/llama-8b"
    args = ["--run", "b", "--store", store, "--model", bucket]
    assert main(["launch", *args, "--dry-run", "--out", str(tmp_path / "t")]) == 1  # missing here: a local store
    text = (tmp_path / "t" / "worker-0.yaml").read_text()
    doc = yaml.safe_load(text)
    assert doc["file_mounts"]["/orch-model"] == {"source": bucket, "mode": "MOUNT_CACHED"}
    assert doc["envs"]["ORCH_MODEL_PATH"] == "/orch-model"
    task = load_task(text)
    (storage,) = task.storage_mounts.values()
    assert (storage.source, storage.mode.value) == (bucket, "MOUNT_CACHED")
    printed = capsys.readouterr().out
    assert f"ok      model weights: {bucket} mounted at /orch-model" in printed and "hub token" not in printed
    assert main(["launch", *args, "--backend", "local"]) == 2
    assert f"{bucket} is a bucket: SkyPilot workers mount it, local workers cannot read it" in capsys.readouterr().err


def test_dry_run_renders_one_task_per_model_pool_with_its_model_and_machines(tmp_path, monkeypatch):
    """A run of two models: each worker's task carries its pool's model (ORCH_POOL) and that model's
    resources (a 70B on 2x A100-80GB, an 8B on an L4), and SkyPilot's loader accepts every task."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", "1")  # none answers there: never start one
    lines = [
        {
            "custom_id": f"r{i}",
            "url": "/v1/chat/completions",
            "body": {"model": m, "messages": [{"role": "user", "content": "hi"}]},
        }
        for i, m in enumerate(["small", "large"] * 4)
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "orch.yaml").write_text(
        "models:\n"
        "  small: {name: org/llama-8b, resources: {gpus: [L4]}}\n"
        "  large: {name: org/llama-70b, tensor_parallel_size: 2, workers: 2,\n"
        "          resources: {gpus: [A100-80GB], gpus_per_worker: 2, spot: false}}\n"
    )
    store = str(tmp_path / "store")
    args = ["--run", "two", "--store", store]
    assert main(["prepare", str(tmp_path / "d.jsonl"), *args, "--format", "openai-batch", "--rows-per-chunk", "1"]) == 0
    assert (
        main(["launch", *args, "--workers", "3", "--dry-run", "--out", str(tmp_path / "t")]) == 1
    )  # missing here: a local store
    docs = {f.name: yaml.safe_load(f.read_text()) for f in sorted((tmp_path / "t").glob("*.yaml"))}
    assert [d["envs"]["ORCH_POOL"] for d in docs.values()] == ["small", "large", "large"]
    assert docs["worker-0.yaml"]["resources"]["accelerators"] == {"L4": 1}
    for name in ("worker-1.yaml", "worker-2.yaml"):
        assert docs[name]["resources"]["accelerators"] == {"A100-80GB": 2}
        assert docs[name]["resources"]["use_spot"] is False
    for f in sorted((tmp_path / "t").glob("*.yaml")):
        load_task(f.read_text())

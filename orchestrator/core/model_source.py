"""Whether a model name is a local path or a hub id, and whether a local one can be loaded.

A worker hands `model.name` to vLLM (or transformers): a directory with a config.json, a single
.gguf file, or a Hugging Face hub id (`org/name`, or a bare `name` such as `gpt2`). A local path
that does not hold a model is found here, before a run is launched and its spec frozen with it;
a hub id is left to the worker, whose failure to load it `orch status` reports.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Buckets a SkyPilot worker mounts the model from (`file_mounts`, MOUNT_CACHED): read from the
#: bucket once per machine and kept on its disk, instead of the hub on every (re)start.
BUCKET_SCHEMES = ("s3://", "gs://", "r2://")
#: Where a SkyPilot worker finds a bucket model mounted, and the variable that tells its engine so.
MODEL_MOUNT = "/orch-model"
MODEL_MOUNT_ENV = "ORCH_MODEL_PATH"


def is_bucket_url(name: str) -> bool:
    """A model in a bucket (`s3://bucket/models/llama-8b`): mounted on SkyPilot workers."""
    return name.startswith(BUCKET_SCHEMES)


#: What the hub accepts as an id: `name` or `org/name`, of letters, digits, `-`, `_` and `.`.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def is_local_path(name: str) -> bool:
    """A name the worker reads from its disk: one that exists here, or that only a path can be
    (absolute, `./`, `../`, `~`, more than one `/`, a .gguf file). `org/name` and `name` that do
    not exist here are hub ids; a bucket URL is neither."""
    if is_bucket_url(name):
        return False
    if Path(name).expanduser().exists():
        return True
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.endswith(".gguf") or not _HUB_ID.match(name)


def local_model_problem(name: str) -> str | None:
    """What is wrong with a local model path, or None (a model is there, or `name` is a hub id)."""
    if not is_local_path(name):
        return None
    path = Path(name).expanduser()
    if not path.exists():
        return f"{name} does not exist (a local model is a directory with a config.json, or a .gguf file)"
    if path.is_file():
        return None if path.suffix == ".gguf" else f"{name} is a file, not a model directory or a .gguf file"
    if not (path / "config.json").is_file():
        return f"{name} has no config.json: not a model directory (a Hugging Face checkout has one)"
    return None


def local_adapter_problem(name: str) -> str | None:
    """What is wrong with a local LoRA adapter path, or None (an adapter is there, or a hub id)."""
    if not is_local_path(name):
        return None
    path = Path(name).expanduser()
    if not path.is_dir():
        return f"{name} is not a directory (a local LoRA adapter is one, with an adapter_config.json)"
    if not (path / "adapter_config.json").is_file():
        return f"{name} has no adapter_config.json: not a LoRA adapter directory"
    return None


def served_name(name: str, engine_args: dict[str, object]) -> str:
    """The name outputs carry in `body.model`, never a path of the worker's disk: vLLM's
    `served_model_name` when the spec gives one (engine_args), else a hub id as it is, else the
    local model's directory (or .gguf file) name."""
    given = engine_args.get("served_model_name")
    if isinstance(given, list) and given and isinstance(given[0], str):
        given = given[0]  # vLLM's list form: the first is the one its server answers with
    if isinstance(given, str) and given:
        return given
    if not is_local_path(name):
        return name
    path = Path(name).expanduser()
    return (path.stem if path.suffix == ".gguf" else path.name) or name

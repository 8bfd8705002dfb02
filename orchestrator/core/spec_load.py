"""Loading a spec: defaults, then the YAML file (each field's line kept for errors), then ORCH_*
environment variables, then command-line flags; validated once as a RunSpec (core/spec.py)."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.core.chat_template import with_templates_read
from orchestrator.core.errors import SpecError
from orchestrator.core.spec import DEFAULT_SPEC_FILE, RunSpec
from orchestrator.core.spec_errors import spec_error

_ENV_SHORTCUTS = {"ORCH_RUN": "run", "ORCH_STORE": "store", "ORCH_BACKEND": "backend", "ORCH_MODEL": "model.name"}
#: ORCH_* variables that configure orch itself rather than the spec.
_ENV_NOT_SPEC = {"ORCH_DEBUG", "ORCH_WORKER_PYTHON", "ORCH_S3_ENDPOINT_URL", "ORCH_HOME"}


# -- loading ------------------------------------------------------------------------------------
def load_spec(
    file: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stored: Mapping[str, Any] | None = None,
    default_file: bool = True,
) -> RunSpec:
    """Resolve the spec from its layers. `flags` maps dotted field paths to the values given on the
    command line (leave out flags that were not given; a None value sets the field to null).
    `default_file=False` ignores ./orch.yaml (workers take their spec from the run alone)."""
    env = os.environ if env is None else env
    layers: list[tuple[str, dict[str, Any], Any]] = []
    if stored:
        layers.append(("the spec frozen into the run", dict(stored), None))
    path = _spec_path(file, cwd) if (file is not None or default_file) else None
    if path is not None:
        data, lines = _read_yaml(path)
        layers.append((str(path), data, lines))
    env_layer = _env_layer(env)
    if env_layer:
        layers.append(("environment", env_layer, None))
    flag_layer = _nest(dict(flags or {}))
    if flag_layer:
        layers.append(("command line", flag_layer, None))

    merged: dict[str, Any] = {}
    spec = RunSpec()
    for source, data, lines in layers:
        merged = _deep_merge(merged, _canonical_names(data, source))
        try:
            spec = RunSpec.model_validate(merged)
        except ValidationError as e:
            raise spec_error(e, source, lines, RunSpec) from None
    # A template named by its file is read here: the run keeps its text (core/chat_template.py).
    return with_templates_read(spec)


def _canonical_names(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """A layer with each field under its one name, so layers merge field by field: `reuse.from` (the
    spelling of files and flags) is `reuse.runs` (the field's name, as a frozen spec records it)."""
    reuse = layer.get("reuse")
    if not isinstance(reuse, Mapping) or "from" not in reuse:
        return layer
    if "runs" in reuse:
        raise SpecError("reuse.from and reuse.runs name the same field: give one", where=source)
    return {**layer, "reuse": {("runs" if k == "from" else k): v for k, v in reuse.items()}}


def _spec_path(file: str | os.PathLike[str] | None, cwd: str | os.PathLike[str] | None) -> Path | None:
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise SpecError(f"spec file {path} does not exist", hint="check the path given to -f")
        return path
    default = Path(cwd or ".") / DEFAULT_SPEC_FILE
    return default if default.is_file() else None


def _read_yaml(path: Path) -> tuple[dict[str, Any], Any]:
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        lines = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError(f"not valid YAML: {getattr(e, 'problem', e)}", where=where) from None
    except RecursionError:  # the YAML reader recurses: a few thousand levels exhaust Python's stack
        raise SpecError("mappings and lists nest too deeply to read", where=str(path)) from None
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        raise SpecError("a spec file is a YAML mapping (key: value lines)", where=str(path))
    return data, lines


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith("ORCH_") or name in _ENV_NOT_SPEC:
            continue
        if name in _ENV_SHORTCUTS:
            path = _ENV_SHORTCUTS[name]
        elif "__" in name:
            path = ".".join(part.lower() for part in name[len("ORCH_") :].split("__"))
        else:
            continue
        if path.split(".")[0] not in RunSpec.model_fields:
            raise SpecError(
                f"{name} names no spec field ({path.split('.')[0]!r} is not a section)",
                hint=f"sections: {', '.join(RunSpec.model_fields)}",
                where="environment",
            )
        flat[path] = raw if path in ("run", "store", "model.name") else _yaml_scalar(raw)
    return _nest(flat)


def _yaml_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out

"""A run's several models (spec `models:`): each a pool of workers with its own model, engine and machines.

A line's `body.model` names the model that answers it: prepare puts the rows of each model in
chunks of their own (ManifestEntry.model), the plan gives each model its own workers
(WorkerAssignment.model), and a worker loads its pool's model once and claims only its pool's
chunks. So no worker switches models, and stealing stays within a pool. A run without `models:`
is one pool, as before (model None everywhere).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.errors import SpecError
from orchestrator.core.frozen_spec import MODEL_OPERATIONAL_FIELDS
from orchestrator.core.model_source import served_name
from orchestrator.core.spec import ModelSpec, PoolSpec, RunSpec

#: The variable a launcher sets to the model a worker loads (a run of several models).
POOL_ENV = "ORCH_POOL"


def model_flags(values: Sequence[str]) -> dict[str, Any]:
    """`--model PATH` sets model.name; `--model NAME=PATH` (repeatable) adds models.NAME."""
    bare = [v for v in values if "=" not in v]
    if len(bare) > 1:
        raise SpecError(
            f"--model given {len(bare)} times without a name ({', '.join(bare)})",
            hint="name each model: --model NAME=PATH_OR_HUB_ID",
            where="--model",
        )
    flags: dict[str, Any] = {"model.name": bare[0]} if bare else {}
    named: dict[str, Any] = {}
    for value in values:
        if "=" in value:
            name, _, target = (part.strip() for part in value.partition("="))
            if not name or not target:
                raise SpecError(
                    f"--model {value!r} is not NAME=PATH_OR_HUB_ID",
                    hint="e.g. small=.cache/models/tiny",
                    where="--model",
                )
            named[name] = {"name": target}
    if named:
        flags["models"] = named  # one key, not models.NAME.name: a served name may hold a dot
    return flags


def run_models(spec: RunSpec) -> dict[str, PoolSpec]:
    """Served name -> its model: the `model` section's fields with the entry's own on top. The
    served name is what outputs carry in body.model (engine_args.served_model_name, unless the
    entry sets its own), never a path; a local directory is made absolute so that workers started
    anywhere find it."""
    base = spec.model.model_dump(exclude={"name"})
    models: dict[str, PoolSpec] = {}
    for name, entry in spec.models.items():
        fields = entry.model_dump(exclude_unset=True)
        pool = PoolSpec.model_validate({**base, **fields})
        if not pool.name:
            raise SpecError(f"model {name!r} names no path or hub id", where=f"models.{name}.name")
        if Path(pool.name).exists():
            pool.name = str(Path(pool.name).resolve())
        if "served_model_name" not in pool.engine_args:
            pool.engine_args = {**pool.engine_args, "served_model_name": name}
        models[name] = pool
    return models


def model_names(spec: RunSpec) -> dict[str, str]:
    """Every name a line may give in body.model -> the pool that answers it: each model's served
    name, and the names of its LoRA adapters (answered by the pool of their base model)."""
    names: dict[str, str] = {}
    for pool, model in run_models(spec).items():
        names[served_name(model.name or "", model.engine_args)] = pool
        names[pool] = pool
        names.update(dict.fromkeys(model.lora, pool))
    return names


def spec_for_pool(spec: RunSpec, pool: str | None) -> RunSpec:
    """The spec a worker of `pool` runs with: its model as the run's `model`, its machines as the
    run's `resources`. None (a run of one model) is the spec itself."""
    if pool is None or not spec.models:
        return spec
    models = run_models(spec)
    if pool not in models:
        raise SpecError(f"no model {pool!r} in the run (models: {', '.join(models)})", where="models")
    chosen = models[pool]
    model = ModelSpec.model_validate(chosen.model_dump(exclude=set(MODEL_OPERATIONAL_FIELDS)))
    return spec.model_copy(update={"model": model, "resources": chosen.resources or spec.resources})


def pool_workers(spec: RunSpec, rows: Mapping[str, int], total: int) -> dict[str, int]:
    """Workers per pool, in the order of `models:`: an entry's own `workers`, else a share of
    `total` (what is left after the fixed ones) in proportion to its rows, at least one each. A
    model with no rows gets no workers."""
    models = run_models(spec)
    fixed = {name: m.workers for name, m in models.items() if m.workers is not None and rows.get(name)}
    shared = [name for name in models if name not in fixed and rows.get(name)]
    left = max(total - sum(v for v in fixed.values() if v), len(shared))
    weight = sum(rows[name] for name in shared) or 1
    counts: dict[str, int] = {}
    for name in models:
        if name in fixed:
            counts[name] = fixed[name] or 1
        elif name in shared:
            counts[name] = max(1, round(left * rows[name] / weight))
    # Rounding may give one too many or too few: the largest shared pool absorbs it.
    if shared:
        biggest = max(shared, key=lambda n: rows[n])
        counts[biggest] = max(1, counts[biggest] + left - sum(counts[n] for n in shared))
    return counts


def machine_gpus(spec: RunSpec) -> dict[str | None, int]:
    """GPUs a worker's machine has (`gpus_per_worker`): the run's resources' (None), and each model
    pool's own (its `resources`, else the run's). A machine is paid for all of them."""
    return {None: spec.resources.gpus_per_worker} | {
        pool: (model.resources or spec.resources).gpus_per_worker for pool, model in run_models(spec).items()
    }

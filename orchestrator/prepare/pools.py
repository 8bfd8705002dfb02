"""Prepare for a run of several models: each row to the model its body.model names, chunks made per model.

A line naming a model the run serves (its served name, or one of its LoRA adapters) goes to that
model's rows; a line naming none goes to the first model listed; a line naming another is set
aside as an error row (`model_not_found`, listing the models served). Each model's rows are held
in their own sorter (an external sort, bounded memory) in input order, or in prompt-prefix order
with `--group-by-prefix`; chunks are then cut per model, so no chunk mixes models, and each chunk
records its model (ManifestEntry.model) and its rows' input positions (collect writes input order).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.core.pools import model_names
from orchestrator.core.spec import DEFAULT_ROWS_PER_CHUNK, ChunkingSpec, RunSpec
from orchestrator.prepare.formats import Request
from orchestrator.prepare.grouping import RUN_BYTES, PrefixSorter
from orchestrator.prepare.writers import ChunkWriter

#: The error code of a line naming a model the run does not serve (as `orch serve` answers it).
MODEL_NOT_FOUND = "model_not_found"


class ModelRouter:
    """Which model answers a request: by the name its line gives, the first model for none."""

    def __init__(self, names: Mapping[str, str], order: list[str]):
        self.names = dict(names)
        self.default = order[0]
        self.order = order

    def pool_of(self, request: Request) -> str | None:
        """The pool (a `models:` key) answering the request, None when its line names no model served."""
        return self.default if request.named_model is None else self.names.get(request.named_model)

    def not_found(self, request: Request) -> str:
        served = ", ".join(self.order)
        return f"{MODEL_NOT_FOUND}: model {request.named_model!r} is not served by this run (models: {served})"


def model_router(spec: RunSpec) -> ModelRouter | None:
    """The router of a run of several models (None for one model). A cascade's run is its first
    stage: every row goes to the cascade's first model, and a line naming another is set aside
    (later stages are runs of their own, fleet/cascade.py)."""
    if not spec.models:
        return None
    names, order = model_names(spec), list(spec.models)
    if spec.sweep.cascade:
        first = spec.sweep.cascade[0]
        names, order = {name: pool for name, pool in names.items() if pool == first}, [first]
    return ModelRouter(names, order)


class PoolSorters:
    """One sorter per model; rows come back per model, in (prefix,) input order."""

    def __init__(self, order: list[str], chunking: ChunkingSpec):
        self.order = order
        self.chunking = chunking
        # Without grouping the sort key is the input position alone (an empty prefix).
        chars = chunking.prefix_chars if chunking.group_by_prefix else 0
        share = max(RUN_BYTES // len(order), 1 << 20)
        self.sorters = {name: PrefixSorter(chars, run_bytes=share) for name in order}

    def add(self, request: Request, position: int) -> None:
        self.sorters[request.pool or self.order[0]].add(request, position)  # "": a sweep of one model

    @property
    def count(self) -> int:
        return sum(s.count for s in self.sorters.values())

    def boundaries(self) -> list[int]:
        """Where chunks start, counted in sorted rows over all models, and the total last: a
        model's rows never share a chunk with another's. `num_chunks` is shared out by rows."""
        cuts, start = [0], 0
        total = self.count or 1
        for name in self.order:
            rows = self.sorters[name].count
            if not rows:
                continue
            if self.chunking.num_chunks is not None:
                chunks = max(1, min(rows, round(self.chunking.num_chunks * rows / total)))
            else:
                chunks = -(-rows // (self.chunking.rows_per_chunk or DEFAULT_ROWS_PER_CHUNK))
            cuts += [start + rows * (i + 1) // chunks for i in range(chunks)]
            start += rows
        return cuts

    def write(self, writer: ChunkWriter) -> None:
        for name in self.order:
            writer.write_sorted(self.sorters[name].sorted_rows(), model=name or None)

    def discard(self) -> None:
        for sorter in self.sorters.values():
            sorter.discard()

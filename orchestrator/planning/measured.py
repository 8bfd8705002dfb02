"""What this machine kind already measured for a model: a worker's speed and start-up, from the store's records.

A quote without a probe starts from the price table's speed, scaled by the model's size: within
3x either way on a GPU, 10x on a CPU. A store that holds a finished chunk of this run, or of an
earlier run of the same model (its weights by content, prepare/answer_keys.content_identity) on
the same kind of machine, knows better: the generated tokens a second one worker made there (a
chunk's stats), its tokens per row, and how long a worker took from launch to its first answers
(startup.py). This run's own chunks come first; else the earlier run whose chunks finished last.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from orchestrator.core.context import RunContext
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.protocol.checkpoints import read_chunk_stats
from orchestrator.core.records import ChunkStats
from orchestrator.core.records.run import run_names
from orchestrator.planning.pricing import GpuTable
from orchestrator.planning.startup import measured_startup_s
from orchestrator.prepare.answers.answer_keys import content_identity

#: Earlier runs read at most, newest first: a store of thousands of runs is not read whole for a quote.
EARLIER_RUNS = 50


@dataclass(frozen=True)
class Measured:
    """Speeds and a start-up finished chunks measured, and whose they were."""

    #: Accelerator (the price table's GPU name, or the chunk's own, e.g. `cpu`) -> one worker's generated tokens/s.
    tokens_per_s: dict[str, float] = field(default_factory=dict)
    #: Generated tokens per row, over the chunks measured.
    tokens_per_row: float | None = None
    startup_s: float | None = None
    #: Whose figures they are, in words: `this run's 3 finished chunks`, `run 'week1' (the same model)`.
    source: str = ""

    def speed(self, accelerator: str) -> float | None:
        return self.tokens_per_s.get(accelerator)


def measured_for(ctx: RunContext, prices: GpuTable, chunks: Collection[str] | None = None) -> Measured | None:
    """This run's own measurements (of `chunks`: a pool's, in a run of several models), else those of
    the earlier run of the same model whose chunks finished last; None when neither has any."""
    own = _of_run(ctx, ctx.layout, prices, chunks=chunks)
    if own is not None:
        return own[1]
    name = ctx.spec.model.name
    if not name:
        return None
    identity = content_identity(name, ctx.spec.model.engine_args)
    found: list[tuple[float, Measured]] = []
    for run in [r for r in run_names(ctx.store) if r != ctx.layout.run][-EARLIER_RUNS:]:
        layout = RunLayout(run)
        stored = read_stored_spec(ctx.store, layout)
        model = ((stored[0].get("model") or {}) if stored else {}).get("name")
        if not model or (model != name and content_identity(model) != identity):
            continue
        measured = _of_run(ctx, layout, prices, earlier=True)
        if measured is not None:
            found.append(measured)
    return max(found, key=lambda f: f[0])[1] if found else None


def _of_run(
    ctx: RunContext,
    layout: RunLayout,
    prices: GpuTable,
    *,
    earlier: bool = False,
    chunks: Collection[str] | None = None,
) -> tuple[float, Measured] | None:
    """(when its last chunk finished, what its chunks measured), or None before any finished."""
    finished = [
        (at, s)
        for chunk, (at, s) in read_chunk_stats(ctx.store, layout).items()
        if s.seconds > 0 and s.tokens_out and (chunks is None or chunk in chunks)
    ]
    if not finished:
        return None
    stats = [s for _, s in finished]
    rows = sum(s.rows for s in stats)
    source = f"run {layout.run!r} (the same model)" if earlier else f"this run's {len(stats)} finished chunk(s)"
    measured = Measured(
        tokens_per_s=_speeds(stats, prices),
        tokens_per_row=sum(s.tokens_out for s in stats) / rows if rows else None,
        startup_s=measured_startup_s(ctx.store, layout),
        source=source,
    )
    return max(at for at, _ in finished), measured


def _speeds(stats: list[ChunkStats], prices: GpuTable) -> dict[str, float]:
    """Generated tokens per second of one worker, per accelerator (named as the price table names it)."""
    tokens: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for s in stats:
        gpu = prices.find(s.accelerator)
        name = gpu.name if gpu is not None else (s.accelerator or "cpu")
        tokens[name] = tokens.get(name, 0.0) + s.tokens_out
        seconds[name] = seconds.get(name, 0.0) + s.seconds
    return {name: tokens[name] / seconds[name] for name in tokens}

"""A probe's work in engine units: what its few batches cost against a run's full ones.

A continuous-batching engine runs up to `slots` rows at once (vLLM's max_num_seqs) and each step
makes one token for every row running; a row enters when a slot frees, in the order it was sent
(the worker sends a chunk's rows by prefix, not as written: forecast.fed).
A run's worker keeps its slots full (it feeds the next chunk while the current one drains), so a
run's steps are about its generated tokens / slots. A probe of a couple of batches does not: in a
heavy-tailed probe the short rows finish and the slots stand empty while the longest row goes on,
one token a step. Counted in tokens, such a probe looks several times slower per token than the
run will be (bench/forecast_bench.py measured +277% on heavy-tailed outputs).

A step costs a fixed part (the model's weights read once, the engine's own overhead) and a part
per running row. Units here are a full step's cost / slots: a step with `active` of `slots` rows
costs `fixed * slots + (1 - fixed) * active` units, so a run at full batches costs one unit per
generated token whatever `fixed` is, and only a probe that ran part-empty depends on it. `fixed` is
not measured (a probe's one engine time cannot split it); the forecast draws it (forecast.py).

An engine of static batches (the transformers engine) runs a batch until its longest row ends, its
finished rows riding along, and picks each batch from a pool by length (core/static_batches.py): a
batch of `active` rows costs its longest row's steps times `fixed * slots + (1 - fixed) * active`
units. The probe's batches are replayed as its engine picked them, and the run's cost per row is
that of a replayed sample of the run's rows. Counted in generated tokens instead, an H200 probe on
mixed output lengths forecast its run 11% short, and on this CPU a heavy-tailed probe, whose one
160-token row held a batch of 8 for 160 steps, forecast its run 92% long (bench/forecast_gpu_bench.py).

Prompts the prefix cache holds cost no prefill: a probe sees fewer hits than its run (run_cached_share).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.core.context import RunContext
from orchestrator.core.records.forecast import RowSample, StratumCount
from orchestrator.core.static_batches import POOL_BATCHES, BatchLimits, pick_batch

#: vLLM's max_num_seqs when engine_args leave it unset (its default on a CPU and on most GPUs), and
#: the transformers engine's max_batch_size on a CPU (worker/engine/hf_engine.py; 1,024 on a GPU).
ENGINE_BATCH_DEFAULT = 256
#: The engine_args key that bounds one engine's batch, per engine.
BATCH_ARG = {"vllm": "max_num_seqs", "transformers": "max_batch_size"}
#: Engines whose batch steps until its longest row ends (worker/engine/hf_engine.py), where vLLM
#: refills a finished row's slot at the next step: a probe's work is counted in their batches.
STATIC_BATCH_ENGINES = {"transformers"}


#: The most of a run's rows a probe takes unless told otherwise (--probe-rows, --probe-share): two
#: engine batches measure a busy engine best, but a probe is a sample, not a fifth of a small run.
DEFAULT_SHARE_CAP = 0.015


def probe_size(rows: int, share: float, min_rows: int | None, batch: int) -> int:
    """How many of `rows` a probe takes: `share` of them, and at least `min_rows` when given; else at
    least two engine batches (one to warm up, one to measure) as long as those stay within
    DEFAULT_SHARE_CAP of the rows."""
    wanted = math.ceil(share * rows)
    if min_rows is not None:
        return max(min_rows, wanted)
    return max(wanted, min(2 * batch, math.floor(DEFAULT_SHARE_CAP * rows)), 1)


def engine_batch(ctx: RunContext) -> int:
    """The most rows one engine runs at once (`model.engine_args.max_num_seqs` for vLLM,
    `max_batch_size` for transformers, else the default): a probe smaller than this measures a
    worker less busy than the run's, which goes faster per row."""
    model = ctx.spec.model
    value = model.engine_args.get(BATCH_ARG.get(model.engine, "max_num_seqs"))
    return int(value) if isinstance(value, int) and value > 0 else ENGINE_BATCH_DEFAULT


def slot_schedule(lengths: Sequence[int], slots: int) -> list[tuple[int, int]]:
    """(start step, end step) of each row, in order: rows enter free slots first come first served,
    each holding its slot for its length in steps (the prefill step makes its first token)."""
    free = [0] * max(1, slots)
    spans = []
    for length in lengths:
        start = heapq.heappop(free)
        end = start + max(1, length)
        heapq.heappush(free, end)
        spans.append((start, end))
    return spans


def units_until(lengths: Sequence[int], slots: int, fixed: float, rows_done: int | None = None) -> float:
    """Decode units of the rows up to the step their `rows_done`-th row finished (None: all of them)."""
    spans = slot_schedule(lengths, slots)
    if not spans:
        return 0.0
    ends = sorted(end for _, end in spans)
    step = ends[-1] if rows_done is None else ends[min(len(ends), max(1, rows_done)) - 1]
    tokens = sum(min(end, step) - start for start, end in spans if start < step)
    return fixed * slots * step + (1.0 - fixed) * tokens


@dataclass(frozen=True, eq=False)
class StaticRow:
    """A row as a static-batch engine's picker sees it (core/static_batches.Pooled), and the steps it ran."""

    prompt_len: int
    max_tokens: int
    steps: int
    key: int = 0
    sequences: int = 1
    logprobs: bool = False

    @classmethod
    def of(cls, x: RowSample) -> StaticRow:
        return cls(x.prompt_tokens, x.max_tokens, x.completion_tokens)


def static_batches(rows: Sequence[StaticRow], slots: int) -> list[tuple[int, int]]:
    """(rows, steps) of each batch a static-batch engine of `slots` runs over `rows` sent in this order."""
    limits = BatchLimits(max(1, slots), sys.maxsize, sys.maxsize)
    pool: list[StaticRow] = []
    batches: list[tuple[int, int]] = []
    sent = 0
    while sent < len(rows) or pool:
        while sent < len(rows) and len(pool) < POOL_BATCHES * limits.max_batch_size:
            pool.append(rows[sent])
            sent += 1
        batch = pick_batch(pool, limits)
        taken = {id(r) for r in batch}
        pool = [r for r in pool if id(r) not in taken]
        batches.append((len(batch), max(r.steps for r in batch)))
    return batches


def static_units(rows: Sequence[StaticRow], slots: int, fixed: float, rows_done: int | None = None) -> float:
    """Decode units of `rows` in a static-batch engine's batches, up to the batch that brought the
    rows done to `rows_done` (None: all of them)."""
    units = 0.0
    done = 0
    for active, steps in static_batches(rows, slots):
        units += max(1, steps) * (fixed * slots + (1.0 - fixed) * active)
        done += active
        if rows_done is not None and done >= rows_done:
            break
    return units


def run_cached_share(samples: Sequence[RowSample], strata: Mapping[str, StratumCount], workers: int) -> float:
    """The share of the run's prompt tokens its engines' prefix caches will hold. A probe's rows meet
    few others of their prefix group, so its own share is low where the run's is high (16 probe rows
    of 4 groups: 12 hits; the run's 1,100 rows: all but a few). So: the share of a prompt the cache
    held in a probe row that hit, times the run's hit rate from its prefix groups (a stratum's last
    field: prepare/probe_carve.py): of a group's n rows over `workers` workers, the first on each
    worker misses. Never below the probe's own share (rows of different groups share a chat
    template's head, which the groups do not see)."""
    prompt = sum(x.prompt_tokens for x in samples)
    own = sum(x.cached_tokens for x in samples) / prompt if prompt else 0.0
    hits = [x for x in samples if x.cached_tokens > 0]
    if not hits:
        return own
    per_hit = sum(x.cached_tokens for x in hits) / max(1, sum(x.prompt_tokens for x in hits))
    groups: dict[str, int] = {}
    for name, count in strata.items():
        group = name.rsplit(".", 1)[-1]
        groups[group] = groups.get(group, 0) + count.rows
    rows = sum(groups.values())
    hit_rows = sum(max(0, n - max(1, workers)) for n in groups.values())
    return max(own, per_hit * hit_rows / rows if rows else 0.0)

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

Prompts the prefix cache holds cost no prefill: a probe sees fewer hits than its run (run_cached_share).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from orchestrator.core.records.forecast import RowSample, StratumCount


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


def run_cached_share(samples: Sequence[RowSample], strata: Mapping[str, StratumCount], workers: int) -> float:
    """The share of the run's prompt tokens its engines' prefix caches will hold. A probe's rows meet
    few others of their prefix group, so its own share is low where the run's is high (16 probe rows
    of 4 groups: 12 hits; the run's 1,100 rows: all but a few). So: the share of a prompt the cache
    held in a probe row that hit, times the run's hit rate from its prefix groups (a stratum's last
    field: controller/probe_carve.py): of a group's n rows over `workers` workers, the first on each
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

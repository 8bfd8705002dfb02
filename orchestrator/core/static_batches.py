"""How an engine of static batches picks its next batch from its pool: the transformers engine
(worker/engine/hf_engine.py) runs it, and the forecast (planning/forecast.py) replays it over a
probe's rows and a run's, since what such a batch costs is its longest row times its rows.

The pool holds POOL_BATCHES batches' worth of requests in arrival order, refilled after every batch.
The next batch is built around the oldest request: the requests that generate alike (same `key`),
the closest to it in length (prompt + max_tokens), grown one at a time to the shorter or the longer
side, whichever adds less padding, while the batch stays within its limits. Sorted by length, the
batch is little padding; anchored on the oldest, no request waits behind newer ones.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

#: The pool holds this many batches' worth, so that the next batch has requests of similar lengths to pick from.
POOL_BATCHES = 2


@dataclass(frozen=True)
class BatchLimits:
    """How large one batch (one `generate` call) may be."""

    #: Sequences (a request with n=4 counts 4).
    max_batch_size: int
    #: Sequences x (the longest prompt + the largest max_tokens): the padded tokens of the call.
    max_batch_tokens: int
    #: Sequences x steps for requests that want logprobs: every step's scores are kept.
    max_logprob_steps: int


class Pooled(Protocol):
    """A request in the pool, as the batch picker sees it."""

    @property
    def key(self) -> Hashable:
        """Requests of equal keys generate alike (same parameters; max_tokens and stop strings aside)."""

    @property
    def prompt_len(self) -> int: ...

    @property
    def max_tokens(self) -> int: ...

    @property
    def sequences(self) -> int:
        """Sequences it generates (its `n`)."""

    @property
    def logprobs(self) -> bool: ...


R = TypeVar("R", bound=Pooled)


def pick_batch(pool: Sequence[R], limits: BatchLimits) -> list[R]:
    """The next batch from `pool` (in arrival order), sorted by length."""
    oldest = pool[0]
    alike = sorted((r for r in pool if r.key == oldest.key), key=lambda r: r.prompt_len + r.max_tokens)
    n, logprobs = oldest.sequences, oldest.logprobs
    lo = next(i for i, r in enumerate(alike) if r is oldest)
    hi = lo + 1  # the batch is alike[lo:hi]
    longest, most_new = oldest.prompt_len, oldest.max_tokens
    useful = longest + most_new

    def fits(sequences: int, padded: int, steps: int) -> bool:
        return (
            sequences <= limits.max_batch_size
            and sequences * padded <= limits.max_batch_tokens
            and (not logprobs or sequences * steps <= limits.max_logprob_steps)
        )

    while True:
        best: tuple[int, int, int, int] | None = None  # (padding, index, longest, most_new)
        sequences = (hi - lo + 1) * n
        for other in (lo - 1, hi):
            if not 0 <= other < len(alike):
                continue
            candidate = alike[other]
            grown = max(longest, candidate.prompt_len), max(most_new, candidate.max_tokens)
            if not fits(sequences, sum(grown), grown[1]):
                continue
            padding = (hi - lo + 1) * sum(grown) - useful - candidate.prompt_len - candidate.max_tokens
            if best is None or padding < best[0]:
                best = (padding, other, *grown)
        if best is None:
            return alike[lo:hi]
        _, other, longest, most_new = best
        useful += alike[other].prompt_len + alike[other].max_tokens
        lo, hi = min(lo, other), max(hi, other + 1)

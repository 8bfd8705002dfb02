"""A stratified sample of a run's rows: the probe's rows (probe_carve.py) and a pilot run's (`--limit N`).

A row's stratum is what its cost depends on (stratum_of): its prompt's length and its output
budget, each on a log2 scale, and its prompt's first bytes (rows sharing a system prompt share a
prefix cache). A sample takes from each stratum in proportion to its size, at least one row of
each while the sample has room, chosen by a generator seeded from a name: the same rows give the
same sample every time.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import orjson

from orchestrator.core.prefix import prefix_hash, prefix_head
from orchestrator.prepare.formats import Request

#: Bytes of a request body that name its prefix group for stratifying (a system prompt's start).
PREFIX_HEAD = 160


def stratum_of(line: bytes, max_tokens: int) -> str:
    """`p<log2 prompt tokens>.m<log2 max_tokens>.<prefix>`: what a row's cost depends on."""
    prompt = max(1, len(line) // 4)
    prefix = prefix_hash(prefix_head(line, PREFIX_HEAD))[:6]
    return f"p{int(math.log2(prompt))}.m{int(math.log2(max(1, max_tokens)))}.{prefix}"


def row_max_tokens(line: bytes, default: int) -> int:
    """The output budget a request line sets (max_completion_tokens, max_tokens), else `default`."""
    try:
        body = orjson.loads(line).get("body") or {}
    except (ValueError, AttributeError):
        return default
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    return int(value) if isinstance(value, int) and value > 0 else default


class Stratified(Protocol):
    """A row as the sampler sees it."""

    @property
    def position(self) -> int: ...

    @property
    def stratum(self) -> str: ...


Row = TypeVar("Row", bound=Stratified)


def lone_prefixes_merged(strata: Sequence[str]) -> list[str]:
    """Each row's stratum, a prefix only one row has merged into `-` (it is no group)."""
    counts: dict[str, int] = defaultdict(int)
    for stratum in strata:
        counts[stratum] += 1
    return [s if counts[s] > 1 else s.rsplit(".", 1)[0] + ".-" for s in strata]


def stratified_sample(rows: Sequence[Row], want: int, seed: str) -> list[Row]:
    """`want` of `rows` (all of them when fewer), proportionally from each stratum, in input order."""
    if want <= 0:
        return []
    strata: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        strata[r.stratum].append(r)
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    # Proportional shares, rounded down, then one each to the strata left out (largest first), then by remainder.
    quota = {s: int(want * len(v) / len(rows)) for s, v in strata.items()}
    order = sorted(strata, key=lambda s: (-(want * len(strata[s]) / len(rows)) % 1, s))
    for s in sorted(strata, key=lambda s: -len(strata[s])):
        if sum(quota.values()) < want and quota[s] == 0:
            quota[s] = 1
    for s in order:
        if sum(quota.values()) >= want:
            break
        quota[s] += 1 if quota[s] < len(strata[s]) else 0
    picked = [r for s in sorted(strata) for r in rng.sample(strata[s], min(quota[s], len(strata[s])))]
    return sorted(picked, key=lambda r: r.position)


class RowStrata:
    """`--limit N`'s first pass: each input row's stratum, from its first request (a sweep's first
    arm), for a stratified sample of the input's rows (conversion.RowStream)."""

    def __init__(self, arms: int, default_max_tokens: int):
        self.arms, self.default = max(arms, 1), default_max_tokens
        self.rows: list[PilotRow] = []

    def add(self, request: Request, position: int) -> None:
        row = position // self.arms
        if self.rows and self.rows[-1].position == row:
            return
        line = request.line
        self.rows.append(PilotRow(row, stratum_of(line, row_max_tokens(line, self.default))))

    def before_row(self, position: int) -> None:
        pass

    def sample(self, limit: int, seed: str) -> list[int]:
        """The input positions of a stratified sample of `limit` rows, in input order."""
        strata = lone_prefixes_merged([r.stratum for r in self.rows])
        rows = [PilotRow(r.position, s) for r, s in zip(self.rows, strata, strict=True)]
        return [r.position for r in stratified_sample(rows, limit, seed)]


@dataclass(frozen=True)
class PilotRow:
    """An input row of `--limit N`'s first pass: its position and stratum."""

    position: int
    stratum: str

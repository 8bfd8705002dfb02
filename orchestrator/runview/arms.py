"""A sweep, arm by arm: rows, errors, tokens, $ and $ per million tokens of each arm.

An arm's requests share chunks (and a pool's workers) with the other arms of its model, so its
numbers come from its finished chunks' output lines (custom_id `<row>#<arm>`, prepare/sweep.py),
and its dollars are its pool's cost so far (runview/models.py; the run's for a sweep of one
model) shared among the pool's arms by the tokens each used. `orch status` (the table and --json
field `arms`: runview/sections.ArmView) and collect's report show them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.records import ManifestEntry
from orchestrator.core.spec import RunSpec
from orchestrator.core.store import Store
from orchestrator.prepare.sweep import ARM_SEPARATOR
from orchestrator.runview.chunk_answers import chunk_answers
from orchestrator.runview.sections import ArmRows, ArmView, ModelView
from orchestrator.runview.tokens import TokenCounts, per_million


@dataclass
class ArmTally:
    rows: int = 0
    errors: int = 0
    tokens: TokenCounts = field(default_factory=TokenCounts)

    def add(self, line: BatchOutputLine) -> None:
        usage = line.usage()
        self.rows += 1
        self.errors += 1 if line.failed else 0
        self.tokens.add(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)


def arm_pools(spec: RunSpec) -> dict[str, str | None]:
    """Arm -> the pool (a `models:` name) answering it; None in a sweep of one model."""
    first = next(iter(spec.models), None)
    return {name: (arm.model or first) if spec.models else None for name, arm in spec.sweep.arms.items()}


def tally_arms(lines: Iterable[BatchOutputLine], arms: Iterable[str]) -> dict[str, ArmTally]:
    """Each arm's rows, errors and tokens from output lines (a line of no arm is left out)."""
    tallies = {arm: ArmTally() for arm in arms}
    for line in lines:
        arm = (line.custom_id or "").rpartition(ARM_SEPARATOR)[2]
        if arm in tallies:
            tallies[arm].add(line)
    return tallies


def finished_lines(
    store: Store, layout: RunLayout, manifest: Sequence[ManifestEntry], done: set[str]
) -> Iterable[BatchOutputLine]:
    """The output lines of the finished chunks (those their done markers list)."""
    for entry in manifest:
        if entry.chunk in done:
            yield from (chunk_answers(store, layout, entry) or {}).values()


def arms_cost(
    tallies: Mapping[str, ArmTally], pools: Mapping[str, str | None], pool_usd: Mapping[str | None, float]
) -> dict[str, ArmView]:
    """Each arm's numbers, its $ its pool's shared among the pool's arms by tokens (see the module doc)."""
    pool_tokens: dict[str | None, int] = {}
    for arm, tally in tallies.items():
        pool_tokens[pools[arm]] = pool_tokens.get(pools[arm], 0) + tally.tokens.total
    out: dict[str, ArmView] = {}
    for arm, tally in tallies.items():
        pool = pools[arm]
        share = tally.tokens.total / pool_tokens[pool] if pool_tokens[pool] else 0.0
        bought = per_million(pool_usd.get(pool, 0.0) * share, tally.tokens)
        out[arm] = ArmView(
            model=pool,
            rows=ArmRows(done=tally.rows, errors=tally.errors),
            tokens=tally.tokens.section(),
            usd=bought.usd,
            usd_per_m_tokens=bought.usd_per_m_tokens,
        )
    return out


def arms_status(
    spec: RunSpec, tallies: Mapping[str, ArmTally] | None, models: Mapping[str, ModelView], run_usd: float
) -> dict[str, ArmView]:
    """A sweep's arms as `orch status` shows them (`models`: the status's per-model numbers, whose $
    the arms share; a sweep of one model shares the run's `run_usd`); empty without a sweep."""
    if not spec.sweep.arms or tallies is None:
        return {}
    pool_usd: dict[str | None, float] = {m: v.usd for m, v in models.items()} if models else {None: run_usd}
    return arms_cost(tallies, arm_pools(spec), pool_usd)

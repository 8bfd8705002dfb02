"""Tokens a run used and what they cost: prompt, cached and generated tokens, and the realised
dollars per million tokens, spot and on-demand apart; `tokens_line` says it in one line (`orch
status`, collect's report and the run's page show it).

The cost is what `orch status` calls cost so far: each worker's machine time (its heartbeats'
uptime, restarts included) at its GPU's price, spot or on-demand as it ran (planning/pricing.py).
The tokens are those of the finished chunks (their stats), each counted for the worker that
finished it. While a run goes, workers have been paid for rows not yet in a finished chunk, so the
rate reads high; once the run is complete it is the run's realised price.

Its shape is runview/sections.CostPerM (`cost_per_m_tokens` in status and in collect's report). A
worker whose GPU the price table does not know (a CPU, a local run) costs 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from orchestrator.core.records import ChunkStats
from orchestrator.runview.sections import Bought, CostPerM, Tokens


@dataclass
class TokenCounts:
    """Prompt tokens (cached ones included), the cached part of them, and generated tokens."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0

    def add(self, prompt: int, cached: int, generated: int) -> None:
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.generated_tokens += generated

    def add_stats(self, stats: ChunkStats) -> None:
        self.add(stats.tokens_in, stats.tokens_cached, stats.tokens_out)

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.generated_tokens

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def section(self) -> Tokens:
        """The counts as the status shows them (frozen)."""
        return Tokens(**self.to_dict())


def tokens_of(stats: Iterable[ChunkStats]) -> TokenCounts:
    counts = TokenCounts()
    for s in stats:
        counts.add_stats(s)
    return counts


def per_million(usd: float, tokens: TokenCounts) -> Bought:
    """What `usd` bought: the tokens, and the price per million of them (null without tokens)."""
    return Bought(
        usd=round(usd, 4),
        **tokens.to_dict(),
        usd_per_m_tokens=round(usd / tokens.total * 1e6, 4) if tokens.total else None,
        usd_per_m_generated=round(usd / tokens.generated_tokens * 1e6, 4) if tokens.generated_tokens else None,
    )


def realised_cost(finished: Iterable[ChunkStats], cost_by_worker: Mapping[str, tuple[float, bool]]) -> CostPerM:
    """$ per million tokens over the whole run, and for spot and on-demand workers apart.
    `cost_by_worker`: worker -> (USD so far, whether it runs on spot)."""
    tokens = {"all": TokenCounts(), "spot": TokenCounts(), "on_demand": TokenCounts()}
    usd = {"all": 0.0, "spot": 0.0, "on_demand": 0.0}
    for dollars, spot in cost_by_worker.values():
        usd["all"] += dollars
        usd["spot" if spot else "on_demand"] += dollars
    for s in finished:
        tokens["all"].add_stats(s)
        if s.worker in cost_by_worker:  # a worker no heartbeat names: neither spot nor on-demand known
            tokens["spot" if cost_by_worker[s.worker][1] else "on_demand"].add_stats(s)
    return CostPerM(**{kind: per_million(usd[kind], tokens[kind]) for kind in tokens})


def tokens_line(tokens: Tokens, per_m: CostPerM | None) -> str:
    """Prompt (cached) and generated tokens, and what a million of them cost, spot and on-demand apart."""
    prompt, cached = tokens.prompt_tokens, tokens.cached_tokens
    share = f", {cached / prompt:.0%}" if prompt else ""
    line = f"tokens {prompt:,} prompt ({cached:,} cached{share}) + {tokens.generated_tokens:,} generated"
    rates = (
        [
            f"{label} {_per_m_text(bought)}"
            for bought, label in ((per_m.all, "cost"), (per_m.spot, "spot"), (per_m.on_demand, "on-demand"))
            if label == "cost" or bought.usd
        ]
        if per_m is not None
        else []
    )
    return line + ("   " + "; ".join(rates) if rates else "")


def _per_m_text(cost: Bought) -> str:
    if cost.usd_per_m_tokens is None:
        return f"${cost.usd:,.2f} (no tokens yet)"
    return f"${cost.usd_per_m_tokens:,.4f}/M tokens (${cost.usd_per_m_generated or 0:,.4f}/M generated)"

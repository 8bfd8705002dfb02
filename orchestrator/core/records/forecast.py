"""What `orch estimate` keeps in the store: the probe (its chunk, the run's strata, what it measured)
and the forecast (bands per candidate), with the actual figures collect adds once the run is done."""

from __future__ import annotations

from pydantic import Field

from orchestrator.core.layout import RunLayout
from orchestrator.core.records.base import Record, read_record
from orchestrator.core.store import Store


class StratumCount(Record):
    """The run's rows of one stratum (prepare/probe_carve.py: prompt length, max_tokens, prefix)."""

    rows: int = 0
    max_tokens: int = Field(0, description="sum over the rows of their max_tokens")
    est_prompt_tokens: int = Field(0, description="sum over the rows of bytes / 4")


class RowSample(Record):
    """One probe row as the engine answered it."""

    stratum: str
    est_prompt_tokens: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    max_tokens: int
    hit_max: bool = Field(description="finish_reason 'length': stopped at max_tokens")
    feed_rank: int | None = Field(None, description="its place in the order the worker sent the rows to its engine")


class ProbeRecord(Record):
    chunk: str = Field(description="the probe chunk (one of the manifest's)")
    gpu: str | None = Field(None, description="the candidate accelerator it was pinned to (None: the spec's choice)")
    model: str | None = Field(None, description="the model pool whose rows it answers (a run of several models)")
    stopped: str | None = Field(None, description="why it measured nothing: its budget spent, or its job's end")
    job: str | None = Field(
        None, description="its worker's job, once launched: a later estimate waits on it while it runs"
    )
    launched_at: float | None = Field(None, description="when that job was launched: its budget counts from there")
    rows: int
    share: float = Field(description="of the run's rows")
    strata: dict[str, StratumCount] = Field(description="every row of the run, probe rows included")
    created_at: float
    accelerator: str | None = Field(None, description="what the probe ran on (its done marker's)")
    threads: int | None = Field(None, description="a local probe: CPU threads its worker had")
    engine_batch: int | None = Field(None, description="rows its engine ran at once (max_num_seqs)")
    static_batches: bool = Field(
        False, description="its engine runs each batch to its longest row (transformers), not continuously (vLLM)"
    )
    busy_s: float | None = Field(None, description="engine seconds of the probe's worker")
    load_s: float | None = None
    busy_cpu_s: float | None = Field(None, description="CPU seconds of the probe's worker in its engine")
    first_batch: list[float] | None = Field(
        None, description="the worker's figures when its first engine batch was done (its heartbeat's)"
    )
    samples: list[RowSample] = Field(default_factory=list)


class Band(Record):
    p10: float
    p50: float
    p90: float


class CandidateForecast(Record):
    gpu: str
    spot: bool
    workers: int
    duration_s: Band
    cost_usd: Band
    engine_s: Band = Field(description="the fleet's engine time (its makespan less start-up)")
    basis: str = Field(description="measured on this accelerator, or scaled from it / from the table")

    @property
    def key(self) -> str:
        """`gpu/spot` or `gpu/on-demand`: how a forecast's `fleet` names its candidate."""
        return f"{self.gpu}/{'spot' if self.spot else 'on-demand'}"


class ForecastRecord(Record):
    at: float
    kind: str = Field(description="probe: measured; guess: no probe (a wide band)")
    workers: int
    output_tokens: Band
    prompt_tokens: int
    candidates: list[CandidateForecast]
    fleet: str = Field(description="gpu/spot key of the candidate the run uses")
    note: str = ""
    #: Filled by collect (or status once the run is complete): what the run really took.
    actual: dict[str, float] | None = None
    #: A run of several models: each pool's own forecast (planning/forecast_pools.py).
    pools: dict[str, ForecastRecord] = Field(default_factory=dict)

    def fleet_candidate(self) -> CandidateForecast | None:
        """The candidate the run uses (the one `fleet` names)."""
        return next((c for c in self.candidates if c.key == self.fleet), None)


def read_probes(store: Store, layout: RunLayout) -> list[ProbeRecord]:
    """Every candidate's probe, in the order they were carved (none: no probe was made)."""
    first = read_record(store, layout.probe, ProbeRecord)
    if first is None:
        return []
    others = [ProbeRecord.from_bytes(store.get(i.key).data) for i in store.list(layout.probes_prefix)]
    return [first[0], *sorted(others, key=lambda p: p.created_at)]

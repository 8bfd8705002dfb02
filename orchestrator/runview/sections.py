"""What a run is, as `orch status --json` gives it: the status and its sections, every field described.

Each section is derived once from the run's facts (runview/status.py) and frozen: a view reads it,
nothing changes it after. The JSON is `RunStatus.model_dump(mode="json")`, and docs/operations.md's
table of its fields is generated from these types (runview/schema_doc.py), so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.backends.base import JobState
from orchestrator.core.records import DecisionRecord
from orchestrator.core.records.forecast import Band
from orchestrator.runview.states import Recovery, RunState, WorkerActivity

#: A worker's state when no job was ever launched for it.
NOT_LAUNCHED = "NOT LAUNCHED"


class Section(BaseModel):
    """A part of the status: frozen once derived, no field beyond those declared."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Chunks(Section):
    total: int = Field(description="chunks in the manifest")
    done: int = Field(description="chunks with a done marker")


class Rows(Section):
    total: int = Field(description="rows in the chunks (not those set aside or reused)")
    done: int = Field(description="rows kept whatever happens: `finished` + `checkpointed`")
    in_progress: int = Field(
        description="answered, held in live workers' memory until their next checkpoint (heartbeats' rows_unsaved)"
    )
    finished: int = Field(description="rows of finished chunks")
    checkpointed: int = Field(description="rows in checkpointed parts of unfinished chunks")
    errors: int = Field(description="error rows in finished chunks")
    set_aside: int = Field(
        description="input rows prepare set aside: not in `total`; collect answers them with error lines"
    )
    reused: int = Field(description="input rows answered by earlier runs (`--reuse-from`): not in `total`")


class Throughput(Section):
    rows_per_s: float = Field(description="summed over the workers answering a chunk now")
    tokens_per_s: float = Field(description="output tokens/s, summed likewise")


class Cost(Section):
    so_far_usd: float = Field(
        description="each worker's uptime (restarts included) at its GPUs' price, spot or on-demand"
    )
    worker_hours: float = Field(description="the workers' uptime summed")
    spot_usd: float = Field(description="the part paid for spot workers")
    on_demand_usd: float = Field(description="the part paid for on-demand workers")


class Pace(Section):
    wall_s: float = Field(
        description="from the first launch (else the first chunk's start) to the last chunk's end, less time cancelled"
    )
    rows_per_s: float = Field(description="rows of finished chunks over `wall_s`")
    tokens_per_s: float = Field(description="output tokens of finished chunks over `wall_s`")


class Tokens(Section):
    prompt_tokens: int = Field(description="prompt tokens of finished chunks, cached ones included")
    cached_tokens: int = Field(description="the prompt tokens the engines' prefix caches held")
    generated_tokens: int = Field(description="tokens the engines generated")


class Bought(Section):
    """What some dollars bought (runview/tokens.py)."""

    usd: float = Field(description="the dollars")
    prompt_tokens: int = Field(description="prompt tokens of the finished chunks of these workers")
    cached_tokens: int = Field(description="of which the prefix caches held")
    generated_tokens: int = Field(description="generated tokens of those chunks")
    usd_per_m_tokens: float | None = Field(description="per million prompt + generated tokens (null without tokens)")
    usd_per_m_generated: float | None = Field(description="per million generated tokens (null without any)")


class CostPerM(Section):
    """The realised $ per million tokens: every worker's, and spot and on-demand workers' apart."""

    all: Bought = Field(description="every worker")
    spot: Bought = Field(description="spot workers")
    on_demand: Bought = Field(description="on-demand workers")


class WorkerView(Section):
    """A worker: planned, launched or heartbeating. Live figures (chunk, rates) come from a heartbeat
    that still beats; totals from the last heartbeat, whatever its age."""

    worker: str = Field(description="its id: a number, or a replica's (`3r1`)")
    state: JobState | Literal["NOT LAUNCHED"] = Field(
        description="its job's state as the backend says; SUCCEEDED once its heartbeat said it exited 0, "
        "WINDING_DOWN for a job still running under a complete run"
    )
    job_id: str | None = Field(None, description="its current job")
    recovery_count: int = Field(
        0, description="relaunches after its job ended with work left, plus the backend's own recoveries"
    )
    recovery: Recovery | None = Field(
        None, description="what the evidence says of its job's recovery (null: none, or no evidence either way)"
    )
    accelerator: str | None = Field(None, description="what it runs on (its heartbeat's, else the backend's)")
    cloud: str | None = Field(None, description="where it runs (its heartbeat's, else the backend's)")
    region: str | None = Field(None, description="likewise")
    spot: bool | None = Field(None, description="on spot (null: not known)")
    chunk: str | None = Field(None, description="the chunk it answers now (while it beats)")
    chunk_rows: int = Field(0, description="rows of that chunk")
    chunk_rows_done: int = Field(0, description="of which answered")
    rows_saved: int = Field(0, description="rows of its chunks in hand checkpointed (while it beats)")
    rows_unsaved: int = Field(0, description="rows of its chunks in hand answered, held in memory (while it beats)")
    chunks_assigned: int = Field(0, description="chunks of its own list in the plan")
    chunks_done_of_own_list: int = Field(0, description="of which done (by any worker)")
    chunks_finished: int = Field(0, description="chunks it finished, from any list")
    rows_done: int = Field(0, description="rows its last heartbeat counts")
    tokens_per_s: float = Field(0.0, description="output tokens/s (while it answers a chunk)")
    rows_per_s: float = Field(0.0, description="rows/s (while it answers a chunk)")
    heartbeat_state: str | None = Field(None, description="its last heartbeat's state")
    heartbeat_age_s: float | None = Field(None, description="seconds since its last heartbeat")
    uptime_s: float = Field(0.0, description="seconds its processes were up, restarts included")
    failure_reason: str | None = Field(None, description="why its current job failed")
    log: str | None = Field(None, description="its log file, or the command that shows it")
    activity: WorkerActivity = Field(
        WorkerActivity.NOT_LAUNCHED, description="what it does, in words (the table below says each)"
    )
    activity_s: float | None = Field(
        None, description="how long: loading since its process started, silent since its last heartbeat"
    )
    clock_offset_s: float | None = Field(
        None, description="its clock minus the store's, as its heartbeat measured (core/protocol/clocks.py)"
    )

    @property
    def state_word(self) -> str:
        """`state` as a word (`RUNNING`, `NOT LAUNCHED`)."""
        return self.state.value if isinstance(self.state, JobState) else self.state


class PoolEstimate(Section):
    pool: str = Field(description="the model pool")
    workers: int = Field(description="its workers")
    rows_left: int = Field(description="its rows not yet in a finished chunk")
    tokens_left: float = Field(description="output tokens those rows will take")
    tokens_per_row: float = Field(description="output tokens per row (measured, or half of max_tokens)")
    gpu: str = Field(description="the pool's fleet candidate")
    tokens_per_s: float = Field(description="of one of its workers")
    measured: bool = Field(description="`tokens_per_s` is what the pool measured on that machine")
    basis: str = Field(description="which speed, in words")
    spot_hours: float = Field(description="time left on spot, preemptions counted")
    spot_usd: float = Field(description="what that costs")
    on_demand_hours: float = Field(description="time left on demand")
    on_demand_usd: float = Field(description="what that costs")


class Estimate(Section):
    """What is left, on the fleet the run runs on (planning/estimate.py)."""

    gpu: str = Field(
        description="the fleet's machine: any_of's pick, or what the run measured where the table has no price"
    )
    workers: int = Field(description="workers the estimate counts")
    tokens_per_s_per_worker: float = Field(description="output tokens/s of one worker on `gpu`")
    measured: bool = Field(description="the speed is the run's own")
    basis: str = Field(description="which speed, in words")
    spot_hours: float = Field(
        description="time left on spot, preemptions counted (a run of several models: its slowest pool's)"
    )
    spot_usd: float = Field(description="what that costs (several models: the pools' summed)")
    on_demand_hours: float = Field(description="time left on demand")
    on_demand_usd: float = Field(description="what that costs")
    slowest_pool: str | None = Field(None, description="a run of several models: the pool the run ends with")
    pools: Mapping[str, PoolEstimate] | None = Field(None, description="a run of several models: each pool's estimate")


class ForecastCheck(Section):
    """The forecast's duration band beside the finish the pace projects (runview/forecast_check.py)."""

    kind: str = Field(description="probe (measured) or guess")
    duration_s: Band = Field(description="the fleet's forecast duration, p10/p50/p90")
    projected_s: float | None = Field(description="time since the first launch plus the ETA (null once complete)")
    projected_in_band: Literal["below p10", "inside", "above p90"] | None = Field(
        None, description="where the projected finish falls in the band"
    )
    actual: Mapping[str, float] | None = Field(None, description="what the run took, once collected")


class ModelRows(Section):
    total: int = Field(description="the model's rows")
    done: int = Field(description="rows of the model's finished chunks")
    errors: int = Field(description="error rows in them")


class ModelView(Section):
    """One model of a run of several (runview/models.py)."""

    chunks: Chunks = Field(description="the model's chunks")
    rows: ModelRows = Field(description="the model's rows")
    tokens: Tokens = Field(description="of its finished chunks")
    workers: int = Field(description="workers of its pool")
    usd: float = Field(description="its pool's cost so far")
    usd_per_m_tokens: float | None = Field(description="what a million of its tokens cost (null without tokens)")


class ArmRows(Section):
    done: int = Field(description="the arm's answers in finished chunks")
    errors: int = Field(description="of which errors")


class ArmView(Section):
    """One arm of a sweep (runview/arms.py)."""

    model: str | None = Field(description="the pool answering it (null: a sweep of one model)")
    rows: ArmRows = Field(description="the arm's rows")
    tokens: Tokens = Field(description="of its answers")
    usd: float = Field(description="its pool's cost shared among the pool's arms by tokens")
    usd_per_m_tokens: float | None = Field(description="what a million of its tokens cost (null without tokens)")


class StageView(Section):
    """One stage of a cascade (runview/cascade.py)."""

    stage: int = Field(description="0 for the run itself")
    model: str = Field(description="the model answering it")
    run: str = Field(description="the run answering it: the run itself for stage 0")
    rows: int | None = Field(description="rows it has to answer (null until recorded)")
    answered: int = Field(description="rows in its done chunks")
    escalated: int | None = Field(description="rows it passed on (null until recorded)")


class RunStatus(Section):
    """A run as `orch status` shows it, derived once from its facts (runview/status.derive_status)."""

    run: str = Field(description="the run's name")
    backend: str | None = Field(description="the backend its workers run on (null: none launched, none beats)")
    complete: bool = Field(description="every chunk has a marker, and none is damaged")
    backend_note: str | None = Field(description="why the backend could not be asked")
    chunks: Chunks = Field(description="the run's chunks")
    rows: Rows = Field(description="the run's rows, by how far they got")
    throughput: Throughput = Field(description="live, summed over running workers")
    eta_s: float | None = Field(description="at the live pace (null when unknown)")
    cost: Cost = Field(description="the money so far")
    workers: Sequence[WorkerView] = Field(description="a row per worker: planned, launched or heartbeating")
    estimate: Estimate | None = Field(None, description="what is left (null without GPU candidates)")
    deadline: DecisionRecord | None = Field(
        None, description="the deadline policy's latest decision (planning/deadline.py)"
    )
    overall: Pace | None = Field(None, description="the finished chunks' pace (null before any)")
    damaged: Mapping[str, str] = Field(
        default_factory=dict, description="chunk -> what is wrong with its marker or parts (`orch redo` each)"
    )
    corrupt_leases: Mapping[str, str] = Field(
        default_factory=dict,
        description="lease key -> what is wrong (treated as expired once older than the lease TTL)",
    )
    tokens: Tokens = Field(description="tokens of the finished chunks")
    cost_per_m_tokens: CostPerM = Field(description="what a million tokens cost so far (runview/tokens.py)")
    timeline: Sequence[tuple[float, float]] = Field(
        default_factory=list,
        description="[unix time, chunks done]: the first launch at 0, then finished chunks (at most 200 points)",
    )
    state: RunState = Field(description="the run in a word")
    prepared_at: float | None = Field(None, description="when prepare finished")
    model: str | None = Field(None, description="the model the run froze (several: their names); null until named")
    input: str | None = Field(None, description="what was prepared: the file, or the folder and how many files")
    run_time_s: float | None = Field(
        None,
        description="from the first launch to now (to the last chunk's end once complete), less the time cancelled",
    )
    models: Mapping[str, ModelView] = Field(default_factory=dict, description="a run of several models: by model")
    arms: Mapping[str, ArmView] = Field(default_factory=dict, description="a sweep: by arm")
    cascade: Sequence[StageView] = Field(default_factory=list, description="a cascade: a row per stage")
    forecast: ForecastCheck | None = Field(None, description="`orch estimate`'s forecast beside the pace")

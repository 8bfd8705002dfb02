"""The run spec: what to run, on what, how: loaded from file < environment < flags (spec_load.py), frozen in the store.

Precedence (later wins), like axolotl's config/env/CLI:
1. built-in defaults;
2. the spec already frozen into the run (so `--run R --store S` alone finds everything again);
3. the spec file: `-f FILE`, or `orch.yaml` in the current directory;
4. environment: ORCH_RUN, ORCH_STORE, ORCH_BACKEND, ORCH_MODEL, and ORCH_<GROUP>__<FIELD>
   (for example ORCH_SAMPLING__MAX_TOKENS=512), values read as YAML scalars;
5. command-line flags.

The fields that decide what the outputs are (model, sampling defaults, input mapping, chunking)
are frozen into the run at prepare/plan time. A later command whose spec differs on those is
refused, with the differing fields named; operational fields (workers, resources, backend) may
change between commands.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.core.errors import SpecError
from orchestrator.core.layout import RunLayout, run_name_problem
from orchestrator.core.prefix import PREFIX_BYTES
from orchestrator.core.request.request_format import check_response_format, template_columns
from orchestrator.core.store import StoreSettings

DEFAULT_SPEC_FILE = "orch.yaml"
DEFAULT_STORE = "./.orch"
DEFAULT_GPUS = ("L4", "L40S", "A10G", "A100", "A100-80GB")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(StrictModel):
    name: str | None = Field(None, description="a local path or a Hugging Face hub id")
    engine: Literal["vllm", "transformers"] = Field("vllm", description="inference engine")
    dtype: str = Field("auto", description="weights dtype: auto, float32, bfloat16, float16")
    max_model_len: int | None = Field(None, ge=16, description="context length (prompt + output)")
    chat_template: str | None = Field(
        None,
        description="a Jinja chat template overriding the model's: its text, or a file's path (read by each command; "
        "the run keeps the text)",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per model replica")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="extra keyword arguments for the engine (vllm.LLM)"
    )
    runner: Literal["generate", "pooling"] = Field(
        "generate",
        description="generate: /v1/chat/completions, /v1/completions and /v1/responses lines; "
        "pooling: /v1/embeddings lines (vLLM's pooling runner). A run is one or the other",
    )
    tool_parser: str | None = Field(
        None,
        description="vLLM's tool parser for lines with `tools` (hermes, llama3_json, mistral, ...): "
        "it reads the model's tool calls back into message.tool_calls",
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's reasoning parser for a reasoning model (deepseek_r1, qwen3, ...): the text before "
        "the end of thinking becomes message.reasoning (a reasoning item in /v1/responses lines), counted in "
        "usage as reasoning tokens; a JSON constraint applies to the answer after it",
    )
    lora: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters a line may name in body.model: {name: local directory or hub id}",
    )
    max_lora_rank: int = Field(16, ge=1, description="the largest rank among the adapters")
    max_loras: int = Field(1, ge=1, description="adapters loaded at once")
    kv_cache_fraction: float = Field(
        0.05,
        gt=0.0,
        le=0.9,
        description="vLLM on a CPU: the share of the memory free at start (MemAvailable) its KV cache gets, "
        "within 64 MiB..8 GiB; engine_args.kv_cache_memory_bytes overrides it. On a GPU vLLM's "
        "gpu_memory_utilization applies",
    )

    @model_validator(mode="after")
    def _engine_can_do_it(self) -> ModelSpec:
        # Run-wide choices the transformers engine cannot honour are refused here, before any
        # worker starts; per-row fields get error rows instead.
        if self.engine == "transformers":
            for name, wanted in (
                ("runner", self.runner == "pooling"),
                ("lora", self.lora),
                ("tool_parser", self.tool_parser),
                ("reasoning_parser", self.reasoning_parser),
            ):
                if wanted:
                    raise ValueError(f"model.{name} needs the vLLM engine (model.engine: vllm)")
        for name in self.lora:
            if not name or name == self.name:
                raise ValueError(f"adapter name {name!r}: a non-empty name other than the model's")
        return self


class SamplingSpec(StrictModel):
    """Defaults for requests that do not set their own parameters."""

    max_tokens: int = Field(256, ge=1)
    # Unset (null): the model's generation_config.json, else OpenAI's default (1.0), as vLLM's
    # server does. `temperature: 0` makes a chunk redone after a preemption give the same answers.
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, description="-1 or null: no top-k")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


class RequestsSpec(StrictModel):
    """How the worker reads request bodies."""

    unknown_fields: Literal["error", "warn"] = Field(
        "error",
        description="a body field no endpoint knows: the row's error (a typo never silently changes an answer), "
        "or, as vLLM's server does, ignored and counted in the run summary",
    )


#: The longest input line read by default (input.max_line_bytes).
MAX_LINE_BYTES = 64 * 1024**2


class InputSpec(StrictModel):
    format: Literal["openai-batch", "completion", "chat", "text"] = Field(
        "chat", description="how input rows become requests"
    )
    id_column: str | None = Field(None, description="column with a stable id for custom_id")
    conversation_column: str = Field("conversation", description="chat: role/content turns")
    turns: Literal["first", "all"] = Field(
        "first", description="chat: the first user turn only, or the conversation up to the last user turn"
    )
    system_prompt: str | None = Field(None, description="chat/text: a system message to prepend")
    text_column: str = Field("text", description="text: the column sent when there is no template")
    template: str | None = Field(
        None,
        description="text/chat: a str.format template whose {fields} name any of the row's columns "
        "('Subject: {subject}\\nBody: {body}'); its text is the user message (chat: instead of the conversation "
        "column). text's default: {<text_column>}",
    )
    response_format: dict[str, Any] | None = Field(
        None,
        description="text/chat: OpenAI's response_format put into every request body: {type: json_object}, or "
        "{type: json_schema, json_schema: {name, schema, strict}} (`--json-schema FILE` writes this one)",
    )
    text_as: Literal["chat", "completion"] = Field(
        "chat", description="text: send the filled template as a user message or as a raw prompt"
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="a pilot run: a stratified sample of this many of the input's rows (by prompt length, output "
        "budget and prompt prefix) instead of all of them; the whole input's run with --reuse-from the pilot "
        "then pays only for the rest",
    )
    max_line_bytes: int = Field(
        MAX_LINE_BYTES,
        ge=1024,
        description="the longest JSONL line read, in bytes: a longer one is set aside unread (prepare) or fails "
        "its batch (orch serve), so memory stays bounded whatever the input",
    )

    @field_validator("template")
    @classmethod
    def _template_fields(cls, template: str | None) -> str | None:
        if template is not None:
            template_columns(template)
        return template

    @field_validator("response_format")
    @classmethod
    def _openai_response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_response_format(value)
        return value

    @model_validator(mode="after")
    def _response_format_where_built(self) -> InputSpec:
        if self.response_format is not None and self.format not in ("text", "chat"):
            raise ValueError(
                f"response_format applies to format text or chat, not {self.format} "
                "(an openai-batch line carries its own body.response_format)"
            )
        return self

    def columns(self) -> list[str] | None:
        """The columns the template names, in order (None without a template)."""
        return None if self.template is None else template_columns(self.template)


#: The chunk size prepare takes when neither rows_per_chunk nor num_chunks is given: a chunk is what a
#: worker claims and a lease guards, so small enough to spread over a fleet and to redo cheaply.
DEFAULT_ROWS_PER_CHUNK = 1000


class ChunkingSpec(StrictModel):
    rows_per_chunk: int | None = Field(None, ge=1, description=f"default: {DEFAULT_ROWS_PER_CHUNK} (prepare)")
    num_chunks: int | None = Field(None, ge=1)
    group_by_prefix: bool = Field(
        False,
        description="sort rows by their prompt's first prefix_chars characters, so that a chunk holds few "
        "shared prefixes and rows of one prefix sit together (collect still writes input order)",
    )
    prefix_chars: int = Field(PREFIX_BYTES, ge=16, description="how much of the prompt's start names its prefix group")

    @model_validator(mode="after")
    def _one_of(self) -> ChunkingSpec:
        if self.rows_per_chunk is not None and self.num_chunks is not None:
            raise ValueError("set rows_per_chunk or num_chunks, not both")
        return self


class WorkersSpec(StrictModel):
    count: int = Field(2, ge=1, description="number of workers (machines)")
    checkpoint_interval: float = Field(60.0, gt=0, description="seconds between output flushes")
    lease_ttl: float = Field(300.0, gt=0, description="seconds a lease lasts without renewal")
    heartbeat_interval: float = Field(10.0, gt=0, description="seconds between heartbeats")
    max_in_flight: int | None = Field(
        None, ge=1, description="requests handed to the engine at once (default: the engine's own)"
    )
    output_format: Literal["jsonl", "parquet"] = "jsonl"
    retries: int = Field(3, ge=0, description="relaunches per worker before `orch watch` gives up")


class JobRecoverySpec(StrictModel):
    strategy: Literal["FAILOVER", "EAGER_NEXT_REGION"] = "EAGER_NEXT_REGION"
    max_restarts_on_errors: int = Field(3, ge=0)


#: sbatch's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
_SLURM_TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)")


class SlurmSpec(StrictModel):
    """What a Slurm cluster needs to be told that SkyPilot cannot find out (resources.slurm)."""

    gpu_names: dict[str, str] = Field(
        default_factory=dict,
        description="orch's GPU name -> the cluster's GRES type (`sinfo -o %G`), for a type SkyPilot's name "
        "matching does not find (A100-80GB: a100_80g); clouds keep orch's names",
    )
    time: str | None = Field(
        None,
        description="wall-time limit of each worker's allocation, in sbatch's words (12:00:00, 2-00:00:00): at "
        "most the partition's MaxTime; a worker killed at it is a lost allocation, recovered like a preemption",
    )
    single_machine: bool = Field(
        False,
        description="the login host is the cluster's only compute node (scripts/local-slurm's bed): a store on "
        "this machine's loopback address reaches the workers",
    )

    @field_validator("time")
    @classmethod
    def _sbatch_time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Slurm time: minutes, hours:minutes:seconds or days-hours:minutes:seconds"
            )
        return value


class ResourcesSpec(StrictModel):
    gpus: list[str] = Field(default_factory=lambda: list(DEFAULT_GPUS))
    gpus_per_worker: int = Field(1, ge=1)
    spot: bool = True
    on_demand: bool = True
    cloud: str | None = None
    region: str | None = None
    infra: list[str] = Field(
        default_factory=list,
        description="where workers run, in SkyPilot's words (slurm/<cluster>, aws, gcp/us-central1, k8s), "
        "tried in this order: an on-prem cluster first, clouds after it; empty: any enabled cloud",
    )
    zones: list[str] = Field(
        default_factory=list,
        description="spot zones (or regions) to steer between, as cloud/region/zone (aws/us-east-1/us-east-1a): "
        "tried in the order of what each did so far (preemptions, time to capacity), on-demand after them",
    )
    cpus: int | None = Field(None, ge=1, description="CPUs per worker; with gpus: [] workers run on CPUs")
    memory: int | None = Field(None, ge=1, description="GB of memory per worker")
    worker_env: str | None = Field(
        None,
        description="a Python environment with orch's worker installed, already on the machines (a shared "
        "path on a Slurm cluster, or in the image): set-up installs nothing and a recovery rebuilds nothing",
    )
    disk_size: int | None = Field(None, ge=10)
    image_id: str | None = None
    job_recovery: JobRecoverySpec = Field(default_factory=JobRecoverySpec)
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)
    task_template: str | None = Field(
        None,
        description="the SkyPilot task each worker is rendered from (a copy of task_templates/worker.yaml, "
        "edited); default: orch's own",
    )

    @field_validator("infra", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _some_pricing(self) -> ResourcesSpec:
        if not (self.spot or self.on_demand):
            raise ValueError("allow spot, on-demand or both")
        if not self.gpus and self.cpus is None:
            raise ValueError("name at least one GPU type, or set cpus for workers without a GPU")
        if self.infra and (self.cloud or self.region):
            raise ValueError("give infra, or cloud and region, not both")
        if self.zones and (self.infra or self.cloud or self.region):
            raise ValueError("zones name the places already: give zones, or infra, or cloud and region")
        bad = [z for z in self.zones if z.count("/") not in (1, 2) or is_on_prem(z)]
        if bad:
            raise ValueError(f"zones are cloud/region[/zone] of a cloud with a spot market, not {', '.join(bad)}")
        if self.infra and all(is_on_prem(p) for p in self.infra) and not self.on_demand:
            raise ValueError(f"{', '.join(self.infra)} has no spot market: allow on-demand (drop --spot)")
        return self


#: SkyPilot infra kinds that are machines of one's own: no spot market there, tried before clouds.
ON_PREM_INFRA = ("slurm", "k8s", "kubernetes", "ssh")


def is_on_prem(infra: str) -> bool:
    return infra.split("/", 1)[0].lower() in ON_PREM_INFRA


class PoolSpec(ModelSpec):
    """One of a run's several models (`models:`): the `model` section's fields with its own on top,
    and its own pool of workers on its own machines (core/pools.py)."""

    workers: int | None = Field(None, ge=1, description="this model's workers; default: workers.count split by rows")
    resources: ResourcesSpec | None = Field(None, description="this model's machines; default: the run's resources")


def bare_model_names(value: Any) -> Any:
    """`{small: PATH}` is `{small: {name: PATH}}`: a bare string names the model's path or hub id."""
    if isinstance(value, dict):
        return {k: {"name": v} if isinstance(v, str) else v for k, v in value.items()}
    return value


class ServeSpec(StrictModel):
    """`orch serve`: the models it serves and the limits it enforces (OpenAI's, unless set here)."""

    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description="served name -> model; a bare string is a path or hub id, the `model` section gives the rest",
    )
    completion_windows: list[str] = Field(
        default_factory=lambda: ["24h"],
        description="the completion_window values a batch may ask for (8h, 90m, 30s...); OpenAI accepts 24h only",
    )
    max_file_bytes: int = Field(200 * 1024**2, ge=1, description="largest batch input file (OpenAI: 200 MB)")
    max_requests: int = Field(50_000, ge=1, description="most request lines in one batch (OpenAI: 50,000)")
    max_upload_bytes: int = Field(
        512 * 1024**2, ge=1, description="largest file POST /v1/files takes, counted as it arrives (OpenAI: 512 MB)"
    )
    upload_idle_timeout: float = Field(
        60.0, gt=0, description="seconds a request body (an upload) may send nothing before the server drops it (408)"
    )
    upload_timeout: float = Field(
        3600.0,
        gt=0,
        description="seconds one request body may take in all (512 MB at 150 KB/s); then it is dropped (408)",
    )
    shutdown_timeout: int = Field(
        5, ge=0, description="seconds requests under way get on SIGTERM or Ctrl-C before they are cut off"
    )
    rows_per_chunk: int = Field(
        500, ge=1, description="chunk size of a batch's run: a cancel or an expiry returns the finished chunks"
    )
    poll_interval: float = Field(5.0, gt=0, description="seconds between the server's rounds over its active batches")
    several_models: bool = Field(
        False,
        description="a batch may name several served models: each line is answered by the model it names, each "
        "model with its own workers (docs/models.md); off: a second model is model_mismatch, as OpenAI answers",
    )
    reuse: bool = Field(
        False,
        description="a batch reuses the answers of its own API key's earlier batches (never another key's) "
        "and runs only the other rows (docs/runs-that-grow.md); reuse.sampled applies",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _bare_names(cls, value: Any) -> Any:
        return bare_model_names(value)


class ArmSpec(StrictModel):
    """One arm of a sweep: the run's input and sampling with the arm's own over them."""

    model: str | None = Field(None, description="a `models:` name (default: the first one listed, or the run's model)")
    template: str | None = Field(None, description="text/chat: this arm's input.template")
    system_prompt: str | None = Field(None, description="chat/text: this arm's input.system_prompt")
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="sampling fields over the run's (temperature, max_tokens, ...)"
    )

    @field_validator("template")
    @classmethod
    def _template_fields(cls, template: str | None) -> str | None:
        if template is not None:
            template_columns(template)
        return template

    @field_validator("sampling")
    @classmethod
    def _sampling_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        SamplingSpec.model_validate(value)
        return value


class ReuseSpec(StrictModel):
    """Answers taken from earlier runs at prepare (docs/runs-that-grow.md)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    runs: list[str] = Field(
        default_factory=list,
        alias="from",
        description="runs whose answers are reused for rows with the same answer key (--reuse-from)",
    )
    sampled: bool = Field(
        False, description="also reuse rows that sample (temperature > 0, no seed): a new sample is not drawn"
    )

    @field_validator("runs")
    @classmethod
    def _run_names(cls, runs: list[str]) -> list[str]:
        for name in runs:
            if (problem := run_name_problem(name)) is not None:
                raise ValueError(problem)
        return runs


class EscalateSpec(StrictModel):
    """When a cascade sends a row on to its next model: any condition set and met escalates it."""

    finish_reason: list[str] = Field(
        default_factory=list, description="finish reasons that escalate (e.g. [length]: the answer was cut)"
    )
    json_schema: bool = Field(
        False, description="escalate an answer that does not parse or validate against its row's json_schema"
    )
    regex: str | None = Field(None, description="escalate an answer whose text this regex matches (re.search)")
    logprob_below: float | None = Field(
        None, description="escalate an answer whose mean token logprob is below this (needs logprobs requested)"
    )

    @field_validator("regex")
    @classmethod
    def _compiles(cls, regex: str | None) -> str | None:
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as e:
                raise ValueError(f"not a regular expression: {e}") from e
        return regex


class SweepSpec(StrictModel):
    """One dataset over several models and/or prompts: every input row answered once per arm."""

    arms: dict[str, ArmSpec] = Field(
        default_factory=dict,
        description="arm name -> what it changes; custom_ids get `#<arm>`, collect writes the arms side by side",
    )

    @field_validator("arms")
    @classmethod
    def _names(cls, arms: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        bad = [name for name in arms if not name or "#" in name]
        if bad:
            raise ValueError(f"arm names are non-empty and hold no '#': {', '.join(map(repr, bad))}")
        return arms

    cascade: list[str] = Field(
        default_factory=list,
        description="`models:` names, cheapest first: every row answered by the first, rows matching "
        "escalate_when sent on to the next",
    )
    escalate_when: EscalateSpec = Field(default_factory=EscalateSpec)


def check_cascade(sweep: SweepSpec, models: list[str]) -> None:
    """A cascade names two or more of the run's models, stands alone (no arms) and has a condition."""
    if not sweep.cascade:
        return
    if sweep.arms:
        raise ValueError("sweep.cascade: a cascade and sweep.arms cannot be combined; use one or the other")
    unknown = [name for name in sweep.cascade if name not in models]
    if unknown:
        known = ", ".join(models) or "none: add a models: section"
        raise ValueError(f"sweep.cascade: {', '.join(map(repr, unknown))} not among the run's models ({known})")
    if len(set(sweep.cascade)) != len(sweep.cascade) or len(sweep.cascade) < 2:
        raise ValueError("sweep.cascade: name two or more different models, cheapest first")
    if not sweep.escalate_when.model_dump(exclude_defaults=True):
        raise ValueError("sweep.escalate_when: set at least one condition (finish_reason, json_schema, regex, ...)")


class RunSpec(StrictModel):
    run: str | None = Field(None, description="the run's name: its prefix in the store")
    store: str = Field(DEFAULT_STORE, description="a directory, s3://BUCKET/PREFIX or r2://BUCKET/PREFIX")
    store_settings: StoreSettings = Field(
        default_factory=StoreSettings, description="timeouts, retries and outage budgets for talking to the store"
    )
    backend: Literal["local", "skypilot"] = "local"
    model: ModelSpec = Field(default_factory=ModelSpec)
    models: dict[str, PoolSpec] = Field(
        default_factory=dict,
        description="several models in one run: served name -> model (a bare string is a path or hub id; the "
        "`model` section gives the rest). A line's body.model picks its model; each model has its own workers",
    )
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    requests: RequestsSpec = Field(default_factory=RequestsSpec)
    input: InputSpec = Field(default_factory=InputSpec)
    chunking: ChunkingSpec = Field(default_factory=ChunkingSpec)
    reuse: ReuseSpec = Field(default_factory=ReuseSpec)
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    serve: ServeSpec = Field(default_factory=ServeSpec)
    sweep: SweepSpec = Field(default_factory=SweepSpec)

    @model_validator(mode="after")
    def _arms_name_models(self) -> RunSpec:
        for name, arm in self.sweep.arms.items():
            if arm.model is not None and arm.model not in self.models:
                known = ", ".join(self.models) or "none: add a models: section"
                raise ValueError(f"sweep.arms.{name}.model: {arm.model!r} is not one of the run's models ({known})")
        check_cascade(self.sweep, list(self.models))
        return self

    @field_validator("models", mode="before")
    @classmethod
    def _bare_model_names(cls, value: Any) -> Any:
        return bare_model_names(value)

    @field_validator("run")
    @classmethod
    def _run_name(cls, run: str | None) -> str | None:
        if run is not None and (problem := run_name_problem(run)) is not None:
            raise ValueError(problem)
        return run

    @property
    def layout(self) -> RunLayout:
        if not self.run:
            raise SpecError("no run name", hint="pass --run NAME, set ORCH_RUN, or put `run:` in orch.yaml")
        return RunLayout(self.run)

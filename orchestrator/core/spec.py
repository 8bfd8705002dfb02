"""The run spec: what to run, on what, how. Loaded from file < environment < flags, frozen into the store.

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

import copy
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core.errors import SpecError
from orchestrator.core.prefix import PREFIX_BYTES
from orchestrator.core.protocol.layout import RunLayout, check_run_name
from orchestrator.core.request_format import check_response_format, template_columns
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
    chat_template: str | None = Field(None, description="a Jinja chat template, overriding the model's")
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
        return self

    @field_validator("models", mode="before")
    @classmethod
    def _bare_model_names(cls, value: Any) -> Any:
        return bare_model_names(value)

    @property
    def layout(self) -> RunLayout:
        if not self.run:
            raise SpecError("no run name", hint="pass --run NAME, set ORCH_RUN, or put `run:` in orch.yaml")
        return RunLayout(check_run_name(self.run))


_ENV_SHORTCUTS = {"ORCH_RUN": "run", "ORCH_STORE": "store", "ORCH_BACKEND": "backend", "ORCH_MODEL": "model.name"}
#: ORCH_* variables that configure orch itself rather than the spec.
_ENV_NOT_SPEC = {"ORCH_DEBUG", "ORCH_WORKER_PYTHON", "ORCH_S3_ENDPOINT_URL", "ORCH_HOME"}


# -- loading ------------------------------------------------------------------------------------
def load_spec(
    file: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stored: Mapping[str, Any] | None = None,
    default_file: bool = True,
) -> RunSpec:
    """Resolve the spec from its layers. `flags` maps dotted field paths to the values given on the
    command line (leave out flags that were not given; a None value sets the field to null).
    `default_file=False` ignores ./orch.yaml (workers take their spec from the run alone)."""
    env = os.environ if env is None else env
    layers: list[tuple[str, dict[str, Any], Any]] = []
    if stored:
        layers.append(("the spec frozen into the run", dict(stored), None))
    path = _spec_path(file, cwd) if (file is not None or default_file) else None
    if path is not None:
        data, lines = _read_yaml(path)
        layers.append((str(path), data, lines))
    env_layer = _env_layer(env)
    if env_layer:
        layers.append(("environment", env_layer, None))
    flag_layer = _nest(dict(flags or {}))
    if flag_layer:
        layers.append(("command line", flag_layer, None))

    merged: dict[str, Any] = {}
    spec = RunSpec()
    for source, data, lines in layers:
        merged = _deep_merge(merged, data)
        try:
            spec = RunSpec.model_validate(merged)
        except ValidationError as e:
            raise _spec_error(e, source, lines) from None
    return spec


def _spec_path(file: str | os.PathLike[str] | None, cwd: str | os.PathLike[str] | None) -> Path | None:
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise SpecError(f"spec file {path} does not exist", hint="check the path given to -f")
        return path
    default = Path(cwd or ".") / DEFAULT_SPEC_FILE
    return default if default.is_file() else None


def _read_yaml(path: Path) -> tuple[dict[str, Any], Any]:
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
        lines = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError(f"not valid YAML: {getattr(e, 'problem', e)}", where=where) from None
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        raise SpecError("a spec file is a YAML mapping (key: value lines)", where=str(path))
    return data, lines


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith("ORCH_") or name in _ENV_NOT_SPEC:
            continue
        if name in _ENV_SHORTCUTS:
            path = _ENV_SHORTCUTS[name]
        elif "__" in name:
            path = ".".join(part.lower() for part in name[len("ORCH_") :].split("__"))
        else:
            continue
        if path.split(".")[0] not in RunSpec.model_fields:
            raise SpecError(
                f"{name} names no spec field ({path.split('.')[0]!r} is not a section)",
                hint=f"sections: {', '.join(RunSpec.model_fields)}",
                where="environment",
            )
        flat[path] = raw if path in ("run", "store", "model.name") else _yaml_scalar(raw)
    return _nest(flat)


def _yaml_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _spec_error(e: ValidationError, source: str, lines: Any) -> SpecError:
    err = e.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]
    field = ".".join(loc) or "(top level)"
    msg = err.get("msg", "invalid")
    hint = "docs/spec.md (the spec: orch.yaml) lists every field and what it takes"
    if err.get("type") == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = ", ".join(parent.model_fields) if parent else ""
        msg = f"unknown field{f' (known: {known})' if known else ''}"
        close = difflib.get_close_matches(loc[-1], list(parent.model_fields) if parent else [], n=1)
        if close:
            hint = f"did you mean {'.'.join([*loc[:-1], close[0]])}?"
    elif "input" in err and err.get("input") is not None:
        msg = f"{msg} (got {repr(err['input'])[:80]})"
    where = source
    line = _line_of(lines, loc)
    if line is not None:
        where = f"{source}:{line}"
    elif source == "environment":
        where = "ORCH_" + "__".join(p.upper() for p in loc) if len(loc) > 1 else source
    error = SpecError(f"{field}: {msg}", where=where, hint=hint)
    error.field = field
    return error


def _model_at(path: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = RunSpec
    for part in path:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _line_of(node: Any, loc: list[str]) -> int | None:
    """The 1-based line of the YAML node at `loc`, or of its nearest existing parent."""
    if node is None:
        return None
    line: int = node.start_mark.line + 1
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if str(key_node.value) == part:
                node, line = value_node, key_node.start_mark.line + 1
                break
        else:
            break
    return line

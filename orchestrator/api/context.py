"""What a command or a Python call works on: the spec flags its options give, and the run's context from them.

The CLI's commands (through `Invocation.context`) and the Python API (orchestrator.run, attach,
estimate) build their flags with `input_flags` and resolve them with `open_run`, so an option means
the same thing, and is checked the same way, whichever way it was given. Each caller names the
options in its own words: `--model` on the command line, `model=` in Python (`Spelling`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.context import RunContext, resolve_spec
from orchestrator.core.errors import SpecError
from orchestrator.core.model_source import is_bucket_url, is_local_path, local_adapter_problem, local_model_problem
from orchestrator.core.pools import run_models
from orchestrator.core.request.request_format import response_format_of, schema_format

Warn = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class Spelling:
    """How a caller names the options: a spec field's flag (`--num-chunks`) or keyword (`num_chunks=`),
    so an error says what the user wrote. `rename` turns an error about a field a flag set into one
    naming the flag; `model` is the option that gives the model."""

    model: str = "--model"
    rename: Callable[[SpecError], SpecError] = field(default=lambda error: error)


def input_flags(
    *,
    fmt: str | None = None,
    num_chunks: int | None = None,
    rows_per_chunk: int | None = None,
    group_by_prefix: bool | None = None,
    id_column: str | None = None,
    turns: str | None = None,
    conversation_column: str | None = None,
    text_column: str | None = None,
    template: str | None = None,
    response_format: str | None = None,
    json_schema: str | Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
    max_line_bytes: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    reuse_from: tuple[str, ...] | list[str] = (),
    reuse_sampled: bool | None = None,
) -> dict[str, Any]:
    """The spec flags (dotted paths) of how input rows become requests; options not given are left
    out. `json_schema` is a schema file's path (the CLI's --json-schema) or the schema itself."""
    if isinstance(json_schema, Mapping):
        if response_format not in (None, "json_schema"):
            raise SpecError(f"response_format {response_format} and a JSON schema: choose one")
        response_format_flag: dict[str, Any] | None = json_schema_format(json_schema)
    else:
        response_format_flag = response_format_of(response_format, json_schema)
    flags: dict[str, Any] = {
        "input.response_format": response_format_flag,
        "input.format": fmt,
        "input.id_column": id_column,
        "input.turns": turns,
        "input.conversation_column": conversation_column,
        "input.text_column": text_column,
        "input.template": template,
        "input.system_prompt": system_prompt,
        "input.max_line_bytes": max_line_bytes,
        "input.limit": limit,
        "sampling.max_tokens": max_tokens,
        "sampling.temperature": temperature,
        "sampling.top_p": top_p,
        "sampling.seed": seed,
        "reuse.from": list(reuse_from) or None,
        "reuse.sampled": reuse_sampled,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    if num_chunks is not None and rows_per_chunk is not None:
        raise SpecError(
            "both a number of chunks and rows per chunk were given: choose one",
            hint="N chunks (--num-chunks, num_chunks=) or chunks of N rows (--rows-per-chunk, rows_per_chunk=)",
        )
    if num_chunks is not None:
        flags.update({"chunking.num_chunks": num_chunks, "chunking.rows_per_chunk": None})
    if rows_per_chunk is not None:
        flags.update({"chunking.rows_per_chunk": rows_per_chunk, "chunking.num_chunks": None})
    if group_by_prefix is not None:
        flags["chunking.group_by_prefix"] = group_by_prefix
    return flags


def json_schema_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's response_format holding answers to `schema`, named after its title (else `schema`),
    as --json-schema names it after its file; checked when the spec loads."""
    title = schema.get("title")
    return schema_format(dict(schema), named_after=title if isinstance(title, str) else None)


def open_run(
    spec_file: str | None,
    flags: Mapping[str, Any],
    *,
    freeze: bool = False,
    check: bool = False,
    model: str | None = None,
    spelling: Spelling | None = None,
    warn: Warn = _quiet,
) -> RunContext:
    """The run's spec (stored < file < environment < flags) and store; with `freeze`, the spec is
    checked against the run's frozen fields and recorded (`check`: checked only). The frozen fields
    a freeze let change (nothing was produced with their old values) are in the context's `notes`.

    `model="required"` (a caller that starts workers) refuses a run without a model, and
    `"checked"` (prepare) a local model path that holds no model, before anything is recorded."""
    spelling = spelling or Spelling()
    try:
        ctx = resolve_spec(spec_file, flags)
    except SpecError as e:
        raise spelling.rename(e) from None
    if model is not None:
        from_flag = "model.name" in flags or "models" in flags
        check_model(ctx, where=spelling.model if from_flag else "model.name", required=model == "required", warn=warn)
    if freeze or check:
        ctx.freeze(write=freeze)
    return ctx


def check_model(ctx: RunContext, *, where: str, required: bool = True, warn: Warn = _quiet) -> None:
    """The run has a model (when `required`), and a local path names one: a directory with a
    config.json or a .gguf file (core/model_source.py), named `where` as the user gave it. On the
    skypilot backend a local path is only warned about: the worker's image may hold it, though this
    machine's disk is out of the cloud machines' reach."""
    for pool, model in run_models(ctx.spec).items():  # a run of several models: each one's
        _check_model_source(ctx, model.name or "", model.lora if required else {}, f"models.{pool}.name", warn)
    if ctx.spec.models:
        return
    name = ctx.spec.model.name
    if not name:
        if required:
            raise SpecError(
                "no model",
                hint=f"give {where if where != 'model.name' else 'the model'} (a local path or a hub id), "
                "or set model.name in orch.yaml",
                where="model.name",
            )
        return
    _check_model_source(ctx, name, ctx.spec.model.lora if required else {}, where, warn)


def _check_model_source(ctx: RunContext, name: str, lora: Mapping[str, str], where: str, warn: Warn) -> None:
    """One model's path (and its adapters' shipped at launch) can be read by the run's workers."""
    if is_bucket_url(name) and ctx.spec.backend != "skypilot":
        raise SpecError(
            f"{name} is a bucket: SkyPilot workers mount it, {ctx.spec.backend} workers cannot read it",
            hint="use the skypilot backend, or give a local copy of the model (or its hub id)",
            where=where,
        )
    if ctx.spec.backend == "skypilot":
        if is_local_path(name):
            warn(
                f"{where} {name} is a path: a cloud machine reads it from its own disk, not this machine's "
                "(use a hub id, or a path baked into the worker's image)"
            )
        return
    problem = local_model_problem(name)
    if problem is not None:
        raise SpecError(
            problem,
            hint="give the directory that holds the model's config.json (or a .gguf file), or a hub id such as "
            "org/name",
            where=where,
        )
    for adapter, source in lora.items():  # shipped at launch, not prepare
        problem = local_adapter_problem(source)
        if problem is not None:
            raise SpecError(problem, hint="give the adapter's directory, or its hub id", where=f"model.lora.{adapter}")

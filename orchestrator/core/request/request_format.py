"""What the input spec adds to every request it builds: a template over the row's columns and OpenAI's
response_format (its JSON schema held to core/request/json_schema.py's check), both checked when the spec loads."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

from orchestrator.core.errors import SpecError
from orchestrator.core.request.json_schema import MAX_SCHEMA_BYTES, SchemaProblem, check_json_schema, loaded_schema
from orchestrator.core.request.schema_lint import schema_problems

#: A schema file is read up to this much: its compact JSON is held to MAX_SCHEMA_BYTES, and a file
#: may be laid out with indentation (a few times the compact size).
MAX_SCHEMA_FILE_BYTES = 8 * MAX_SCHEMA_BYTES


def template_columns(template: str) -> list[str]:
    """The columns a str.format template names ({subject}, {body}); a template that is not one, or
    that asks for positions ({}, {0}), is refused with what is wrong."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ValueError(f"not a str.format template: {e} (write a literal brace as {{{{ or }}}})") from None
    columns: list[str] = []
    for name in fields:
        column = name.split(".")[0].split("[")[0]
        if not column or column.isdigit():
            raise ValueError(f"the template's field {{{name}}} names no column: write {{column_name}}")
        if column not in columns:
            columns.append(column)
    return columns


def check_response_format(value: dict[str, Any]) -> None:
    """OpenAI's response_format, checked before anything is prepared: a known type, and for
    json_schema a name and a schema that is itself a valid JSON Schema."""
    kind = value.get("type")
    if kind in ("text", "json_object"):
        if set(value) != {"type"}:
            raise ValueError(f"type {kind} takes no other keys (got {', '.join(sorted(set(value) - {'type'}))})")
        return
    if kind != "json_schema":
        raise ValueError(f"type {kind!r}: expected text, json_object or json_schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or set(value) != {"type", "json_schema"}:
        raise ValueError("type json_schema takes one more key, json_schema: {name, schema, strict}")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise ValueError(f"json_schema: unknown key(s) {', '.join(sorted(unknown))} (known: name, schema, strict)")
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"json_schema.name {name!r}: 1-64 letters, digits, _ or - (OpenAI's rule)")
    if not isinstance(spec.get("strict", False), bool):
        raise ValueError("json_schema.strict: true or false")
    check_json_schema(spec.get("schema"))
    strict = spec.get("strict") is True
    problems = schema_problems(spec["schema"], strict=strict)
    if problems:
        under = " (strict: true, as OpenAI's structured outputs hold it)" if strict else ""
        raise ValueError(f"json_schema.schema: {len(problems)} problem(s){under}: " + "; ".join(problems))


def response_format_of(kind: str | None, schema_file: str | None) -> dict[str, Any] | None:
    """The response_format `--response-format KIND` and `--json-schema FILE` ask for (None: neither)."""
    if schema_file is None:
        if kind == "json_schema":
            raise SpecError("--response-format json_schema needs its schema", hint="add --json-schema FILE")
        return None if kind is None else {"type": kind}
    if kind not in (None, "json_schema"):
        raise SpecError(f"--response-format {kind} and --json-schema: choose one")
    schema = load_json_schema(schema_file)
    return schema_format(schema, named_after=Path(schema_file).stem)


def schema_format(schema: dict[str, Any], named_after: str | None) -> dict[str, Any]:
    """OpenAI's response_format holding answers to `schema`, its name from `named_after` (a file's
    stem, a schema's title; OpenAI allows 1-64 letters, digits, _ and -; else `schema`): strict
    (OpenAI's structured outputs) where the schema meets its rules, every object closed and every
    property required; vLLM's grammar holds either, and a line sent to OpenAI as it is is taken."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", named_after or "")[:64] or "schema"
    strict = not schema_problems(schema, strict=True)
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def load_json_schema(path: str) -> dict[str, Any]:
    """A JSON Schema file, read and held to the workers' check (core/request/json_schema.py); every fault
    names the file (and line, or the place in the schema)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SCHEMA_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read the JSON schema: {getattr(e, 'strerror', None) or e}", where=path) from None
    if len(data) > MAX_SCHEMA_FILE_BYTES:
        raise SpecError(
            f"the file is over {MAX_SCHEMA_FILE_BYTES:,} bytes "
            f"(a schema is at most {MAX_SCHEMA_BYTES:,} as compact JSON)",
            where=path,
        )
    schema: Any = None
    try:
        schema = loaded_schema(text)
        check_json_schema(schema)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON: {e.msg} (column {e.colno})", where=f"{path}:{e.lineno}") from None
    except SchemaProblem as e:
        _refuse_mistakes(schema, path)  # a misspelt keyword often is what makes the schema unmatchable
        raise SpecError(str(e), where=path, hint="https://json-schema.org/understanding-json-schema") from None
    _refuse_mistakes(schema, path)
    return schema  # type: ignore[no-any-return]


def _refuse_mistakes(schema: Any, path: str) -> None:
    """What the schema's author did not mean (core/request/schema_lint.py: unknown keywords, `required`
    names without a property), every one at once, naming the file."""
    try:
        mistakes = schema_problems(schema, strict=False)
    except RecursionError:  # nested past what the check refuses anyway
        return
    if mistakes:
        raise SpecError(
            f"{len(mistakes)} mistake(s) in the schema:\n  " + "\n  ".join(mistakes),
            where=path,
            hint="a keyword no validator knows constrains nothing; docs/labelling.md (the schema) shows one",
        )

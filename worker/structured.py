"""Constrained decoding from a request body: `response_format`, vLLM's `structured_outputs`, and `logit_bias`.

The result is plain data (hashable, engine-free): the vLLM engine turns it into vLLM's
`StructuredOutputsParams` and `SamplingParams.logit_bias`; the transformers engine honours
`logit_bias` and answers a constraint with an error row naming the engine to use. A JSON schema
is held to the one check `orch prepare` runs too (core/request/json_schema.py: size, nesting, `$ref`s,
a value that can match it); whether a regex or grammar compiles is vLLM's to say: its refusal
becomes the row's error. An empty answer under a JSON constraint is never a success (`empty_answer`).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core.request.json_schema import SchemaProblem, check_json_schema
from worker.wire import Constraint

#: The constraints of vLLM's `structured_outputs` extension that orch passes on (one per request).
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
#: Options vLLM 0.32 accepts per request but does not apply (its grammar backends read them from the
#: engine's config): refused per row, with where to set them instead.
ENGINE_WIDE_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
#: The error code of a row whose answer under a JSON constraint is empty (`empty_answer`).
EMPTY_ANSWER = "empty_structured_output"
#: vLLM clamps nothing: OpenAI documents logit_bias values from -100 to 100.
BIAS_LIMIT = 100.0


class StructuredError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def constraint(body: dict[str, Any]) -> Constraint | None:
    """The request's constraint, if any: from `response_format` or from `structured_outputs` (one of them)."""
    from_format = _response_format(body.get("response_format"))
    given = _structured_outputs(body.get("structured_outputs"))
    if from_format is not None and given is not None:
        raise StructuredError(
            f"response_format and structured_outputs.{given.kind} both constrain the output: keep one",
            "structured_outputs",
        )
    return from_format or given


def logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """`{"token id": bias}` as sorted (id, bias) pairs; vLLM checks the ids against the vocabulary."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise StructuredError('logit_bias must be an object {"token id": bias}', "logit_bias")
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise StructuredError(f"logit_bias: {key!r} is not a token id", "logit_bias") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -BIAS_LIMIT <= bias <= BIAS_LIMIT:
            raise StructuredError(f"logit_bias[{key!r}]={bias!r}: expected a number from -100 to 100", "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _response_format(value: Any) -> Constraint | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", "true", "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise StructuredError(
                "response_format json_schema needs json_schema.schema, a JSON schema object", "response_format"
            )
        # `strict` changes nothing here: vLLM always holds the output to the schema.
        return Constraint("json", _checked(schema, "response_format"), "response_format")
    raise StructuredError(
        f"response_format type {kind!r}: expected text, json_object or json_schema", "response_format"
    )


def _structured_outputs(value: Any) -> Constraint | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise StructuredError("structured_outputs must be an object", "structured_outputs")
    for name in ENGINE_WIDE_OPTIONS:
        if value.get(name) is not None:
            raise StructuredError(
                f"structured_outputs.{name} applies to the whole engine in vLLM: set it in the spec "
                f"(model.engine_args: {{structured_outputs_config: {{backend: xgrammar, {name}: ...}}}})",
                "structured_outputs",
            )
    unknown = sorted(set(value) - set(STRUCTURED_KINDS))
    if unknown:
        raise StructuredError(
            f"structured_outputs.{unknown[0]} is not supported here (use one of {', '.join(STRUCTURED_KINDS)})",
            "structured_outputs",
        )
    given = [(k, v) for k, v in value.items() if v is not None and v is not False]
    if len(given) != 1:
        raise StructuredError(
            f"structured_outputs takes exactly one of {', '.join(STRUCTURED_KINDS)}, got {len(given)}",
            "structured_outputs",
        )
    kind, arg = given[0]
    ok = {
        "json": isinstance(arg, (dict, str)),
        "regex": isinstance(arg, str),
        "grammar": isinstance(arg, str),
        "choice": isinstance(arg, list) and bool(arg) and all(isinstance(c, str) for c in arg),
        "json_object": arg is True,
    }[kind]
    if not ok:
        raise StructuredError(f"structured_outputs.{kind}={arg!r} has the wrong type", "structured_outputs")
    if kind == "json" and isinstance(arg, str):
        try:
            arg = json.loads(arg)
        except (ValueError, RecursionError) as e:
            raise StructuredError(f"structured_outputs.json is not JSON: {e}", "structured_outputs") from None
    if kind == "json":
        return Constraint(kind, _checked(arg, "structured_outputs.json"), "structured_outputs")
    return Constraint(kind, json.dumps(arg), "structured_outputs")


def _checked(schema: Any, name: str) -> str:
    """The schema's text, once it passed the one schema check (core/request/json_schema.py)."""
    try:
        return check_json_schema(schema)
    except SchemaProblem as e:
        raise StructuredError(f"{name}'s JSON schema: {e}", name.partition(".")[0]) from None


def empty_answer(constraint: Constraint | None, texts: list[str]) -> str | None:
    """Why an answer under a JSON constraint is not one: an empty text is not JSON (a schema no
    value can match ends generation at once, with finish_reason stop). None when no text is empty."""
    if constraint is None or constraint.kind not in ("json", "json_object") or all(texts):
        return None
    return (
        f"the answer is empty under the row's {constraint.source} JSON constraint: an empty text is not JSON "
        "(a schema no value can match ends the answer at once); check the schema with orch prepare --check"
    )

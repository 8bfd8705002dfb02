"""What a JSON schema says that its author did not mean, as OpenAI's strict structured outputs would refuse it.

A JSON Schema validator ignores a keyword it does not know, so `enun: [low, high]` (for `enum`)
passes every check and constrains nothing: the model may answer anything. A `required` name with
no property behind it cannot be met when the object admits no other properties. OpenAI's strict
mode refuses both, and, where `strict: true` (what `--json-schema FILE` asks for), an object
without `additionalProperties: false` or with a property left out of `required`. Each problem is
named by its place in the schema (a JSON pointer), with the keyword it most likely meant.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

#: Keywords a schema may use (JSON Schema 2020-12's, and the annotations OpenAI's strict mode takes).
KEYWORDS = frozenset(
    {
        "$schema", "$id", "$ref", "$defs", "definitions", "$comment", "$anchor", "$dynamicRef", "$dynamicAnchor",
        "type", "enum", "const", "title", "description", "default", "examples", "deprecated", "readOnly",
        "writeOnly", "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
        "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
        "items", "prefixItems", "contains", "minContains", "maxContains", "minItems", "maxItems", "uniqueItems",
        "unevaluatedItems", "minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf",
        "not", "if", "then", "else",
    }
)  # fmt: skip
#: Keywords whose value is one schema, a list of schemas, or a map of name -> schema.
_ONE = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def schema_problems(schema: Any, *, strict: bool) -> list[str]:
    """Every problem of `schema`, each as `<JSON pointer>: what is wrong` (empty: none)."""
    return list(_walk(schema, "", strict))


def _walk(node: Any, at: str, strict: bool) -> Iterator[str]:
    if not isinstance(node, dict):
        return
    place = at or "/"
    for key in node:
        if key not in KEYWORDS and not key.startswith("x-"):  # x-...: a vendor's extension, by convention
            close = difflib.get_close_matches(key, KEYWORDS, n=1)
            yield f"{place}: unknown keyword {key!r}" + (f" (did you mean {close[0]!r}?)" if close else " (ignored)")
    properties = node.get("properties")
    if isinstance(properties, dict):
        yield from _object(node, properties, place, strict)
    for key in _ONE:
        yield from _walk(node.get(key), f"{at}/{key}", strict)
    for key in _MANY:
        for i, sub in enumerate(node.get(key) or []):
            yield from _walk(sub, f"{at}/{key}/{i}", strict)
    for key in _NAMED:
        named = node.get(key)
        if isinstance(named, dict):
            for name, sub in named.items():
                yield from _walk(sub, f"{at}/{key}/{_escaped(name)}", strict)


def _object(node: dict[str, Any], properties: dict[str, Any], place: str, strict: bool) -> Iterator[str]:
    required = node.get("required") or []
    for name in required:
        if name not in properties:
            close = difflib.get_close_matches(str(name), list(properties), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            yield f"{place}: required names {name!r}, which is not one of its properties{hint}"
    if not strict:
        return
    if node.get("additionalProperties") is not False:
        yield f"{place}: strict mode needs additionalProperties: false on every object"
    missing = [name for name in properties if name not in required]
    if missing:
        yield (
            f"{place}: strict mode needs every property in required: add {', '.join(map(repr, missing))} "
            "(an optional one is required with anyOf [its type, null])"
        )


def _escaped(name: str) -> str:
    """A name as a JSON pointer segment (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")

"""The one check of a JSON schema that constrains answers (the spec, prepare and the worker run it
alike), and the reference a run's request lines carry in place of the spec's schema.

A schema passes when the worker's engine can use it and some answer can meet it:

1. it is an object, at most MAX_SCHEMA_BYTES as compact JSON, nested at most MAX_SCHEMA_NESTING
   levels of objects and arrays (vLLM 0.32 refuses deeper ones, counted the same way);
2. every `$ref` points inside the schema (`#` or `#/...`, what xgrammar resolves) at something
   that is there;
3. some finite JSON value matches it: a `$ref` loop with no value in between (`a` -> `b` -> `a`),
   or a required property that needs the object it is in, matches nothing, and the engine would
   answer it with an empty text;
4. it is valid against its metaschema (jsonschema, where installed).

Each problem is a SchemaProblem naming where in the schema it is (a JSON pointer); callers add
the file, the line or the field. A schema that passed is remembered by its text, so a schema
repeated on a million lines, or loaded again with its run's spec, is checked once per process.

The spec's schema is stored once in the run (`runs/<run>/schemas/<sha256>.json`, written with
the frozen spec) and its request lines carry `{"$ref": "urn:orch:schema:sha256:<hex>"}` in its
place: RunSchemas turns the reference back into the schema wherever a line is read (the worker,
prepare's check, a cascade's next stage, the retry file).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

#: The largest schema taken, as compact JSON. xgrammar 0.2.8 compiled a 72 KB schema in 1.8 s and
#: a 218 KB one in 13 s here (tiny-llama's vocabulary; longer with a larger one); OpenAI's own
#: limits (5,000 properties, 120,000 characters of names and enum values) fit in about this.
MAX_SCHEMA_BYTES = 256 * 1024
#: Objects and arrays within each other: vLLM 0.32's MAX_STRUCTURED_OUTPUT_JSON_NESTING.
MAX_SCHEMA_NESTING = 64
#: How a request line names the run's stored schema (a URN: a name, not a place to fetch).
SCHEMA_URN = "urn:orch:schema:sha256:"

#: Keywords whose value maps names to subschemas, holds one subschema, or a list of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = (
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
#: Types a value can always be given in (constraints such as minLength aside).
_SIMPLE_TYPES = {"string", "number", "integer", "boolean", "null"}
#: Schemas that passed, by their text (bounded: cleared when full).
_CHECKED: set[str] = set()
_CHECKED_LIMIT = 1024


class SchemaProblem(ValueError):
    """What is wrong with a schema, and where in it (a JSON pointer, `#` for the whole)."""

    def __init__(self, message: str, pointer: str = "#"):
        super().__init__(message)
        self.message = message
        self.pointer = pointer

    def __str__(self) -> str:
        return self.message if self.pointer == "#" else f"at {_shown(self.pointer)}: {self.message}"


def schema_text(schema: Any) -> str:
    """The schema as compact JSON, keys in their order (an object's properties are generated in
    it): what is stored, referenced by digest, and compared."""
    try:
        return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise SchemaProblem(_too_deep()) from None


def check_json_schema(schema: Any) -> str:
    """Steps 1-4 of the module docstring, or a SchemaProblem; returns the schema's text."""
    if not isinstance(schema, dict):
        raise SchemaProblem(f"a JSON schema is an object, not {type(schema).__name__}")
    text = schema_text(schema)
    if text in _CHECKED:
        return text
    _check_nesting(schema)
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise SchemaProblem(
            f"the schema is {size:,} bytes as compact JSON; at most {MAX_SCHEMA_BYTES:,} are taken "
            "(the engine compiles it into a grammar: larger ones take minutes)"
        )
    nodes = _subschemas(schema)
    _check_satisfiable(nodes)
    _check_metaschema(schema)
    if len(_CHECKED) >= _CHECKED_LIMIT:
        _CHECKED.clear()
    _CHECKED.add(text)
    return text


def loaded_schema(text: str) -> Any:
    """A schema file's text as JSON, deep nesting refused with a SchemaProblem (not a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise SchemaProblem(_too_deep()) from None


def _too_deep() -> str:
    return f"objects and arrays nest deeper than the {MAX_SCHEMA_NESTING} levels vLLM takes"


def _check_nesting(schema: dict[str, Any]) -> None:
    """vLLM's count, level by level (no recursion): the schema is level 0, its objects' and
    arrays' members holding objects or arrays the next level."""
    level: list[tuple[Any, str]] = [(schema, "#")]
    for _ in range(MAX_SCHEMA_NESTING):
        level = [
            (child, f"{pointer}/{_escape(str(key))}")
            for node, pointer in level
            for key, child in (node.items() if isinstance(node, dict) else enumerate(node))
            if isinstance(child, (dict, list))
        ]
        if not level:
            return
    raise SchemaProblem(_too_deep(), level[0][1])


# -- references and satisfiability ------------------------------------------------------------------


def _subschemas(schema: dict[str, Any]) -> dict[str, Any]:
    """Every subschema by its pointer, each `$ref` checked to point inside the schema at something
    there (its target then counted as a subschema too)."""
    nodes: dict[str, Any] = {}
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, pointer = stack.pop()
        if pointer in nodes:
            continue
        nodes[pointer] = node
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if ref is not None:
            target = _ref_target(ref, pointer)
            stack.append((_resolve(schema, target, pointer, ref), target))
        stack.extend(_children(node, pointer))
    return nodes


def _children(node: dict[str, Any], pointer: str) -> Iterator[tuple[Any, str]]:
    for key in _SCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            yield from ((sub, f"{pointer}/{key}/{_escape(name)}") for name, sub in value.items())
    for key in _SCHEMA_ONE:
        value = node.get(key)
        if isinstance(value, (dict, bool)):
            yield value, f"{pointer}/{key}"
    for key in _SCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            yield from ((sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(value))


def _ref_target(ref: Any, pointer: str) -> str:
    """A `$ref`'s target as a pointer of this module's form (`#/a/b`, tokens escaped, not percent-encoded)."""
    if not isinstance(ref, str):
        raise SchemaProblem(f"$ref must be a string, not {type(ref).__name__}", pointer)
    if ref != "#" and not ref.startswith("#/"):
        raise SchemaProblem(
            f"$ref {ref!r} points outside the schema: only references within it (# or #/...) are followed",
            pointer,
        )
    return "#" + "".join("/" + _escape(token) for token in _tokens(ref))


def _tokens(ref: str) -> list[str]:
    """A `#/...` reference's JSON pointer tokens (RFC 6901, percent-decoded as a URI fragment)."""
    if ref == "#":
        return []
    return [unquote(t).replace("~1", "/").replace("~0", "~") for t in ref[2:].split("/")]


def _resolve(schema: Any, target: str, pointer: str, ref: str) -> Any:
    node = schema
    for token in _tokens(target):
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise SchemaProblem(f"$ref {ref!r} points at nothing: the schema has no {token!r} there", pointer)
    return node


def _check_satisfiable(nodes: dict[str, Any]) -> None:
    """Step 3: which subschemas some finite value matches, found as a grammar's productive symbols
    are (a worklist: a schema is re-examined when one it needs is found to match something); the
    whole schema must be one of them."""
    needs = {pointer: _needs(node, pointer) for pointer, node in nodes.items()}
    needed_by: dict[str, list[str]] = {pointer: [] for pointer in nodes}
    for pointer, groups in needs.items():
        for group in groups or ():
            for child in group:
                needed_by.setdefault(child, []).append(pointer)
    matches: set[str] = set()
    work = list(nodes)
    while work:
        pointer = work.pop()
        if pointer in matches:
            continue
        groups = needs[pointer]
        if groups is not None and all(any(child in matches for child in group) for group in groups):
            matches.add(pointer)
            work.extend(needed_by.get(pointer, ()))
    if "#" not in matches:
        raise SchemaProblem(f"no JSON value can match the schema: {_why_not(needs, matches)}")


def _needs(node: Any, pointer: str) -> list[list[str]] | None:
    """What a subschema needs for some value to match it: groups of subschemas, one of each group
    matching something (all of them: every group met). None: nothing can match it."""
    if node is False:
        return None
    if not isinstance(node, dict):
        return []  # true, or a schema of another type (the metaschema check's to refuse)
    groups: list[list[str]] = []
    if isinstance(node.get("$ref"), str):
        groups.append([_ref_target(node["$ref"], pointer)])
    for key in ("allOf", "anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            listed = [f"{pointer}/{key}/{i}" for i in range(len(branches))]
            groups.extend([[branch] for branch in listed] if key == "allOf" else [listed])
    if node.get("enum") == []:
        return None
    if "const" in node or "enum" in node:
        return groups
    kinds = _types(node)
    if kinds & _SIMPLE_TYPES or not kinds:
        return groups
    choices: list[list[list[str]]] = []  # one way per type left: object, array
    if "object" in kinds:
        choices.append(_object_needs(node, pointer))
    if "array" in kinds:
        choices.append(_array_needs(node, pointer))
    if len(choices) != 1:
        return groups  # object or array, each with needs: taken as matching (never a valid schema refused)
    return groups + choices[0]


def _types(node: dict[str, Any]) -> set[str]:
    """The types a schema allows; without `type`, object or array when only their keywords are there."""
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    if any(k in node for k in ("properties", "required", "additionalProperties")):
        return {"object"}
    if any(k in node for k in ("items", "prefixItems", "minItems")):
        return {"array"}
    return set()


def _object_needs(node: dict[str, Any], pointer: str) -> list[list[str]]:
    """Each required property's schema (a declared property's, else additionalProperties')."""
    properties = value if isinstance(value := node.get("properties"), dict) else {}
    extra = node.get("additionalProperties", True)
    needs = []
    for name in node.get("required") or ():
        if not isinstance(name, str):
            continue
        if name in properties:
            needs.append([f"{pointer}/properties/{_escape(name)}"])
        elif extra is False and not node.get("patternProperties"):
            needs.append([])  # required, yet no property of that name is allowed: an empty group never holds
        elif isinstance(extra, dict):
            needs.append([f"{pointer}/additionalProperties"])
    return needs


def _array_needs(node: dict[str, Any], pointer: str) -> list[list[str]]:
    """The first minItems items' schemas (prefixItems', then items')."""
    least = value if isinstance(value := node.get("minItems"), int) else 0
    prefix = value if isinstance(value := node.get("prefixItems"), list) else []
    items = node.get("items")
    needs = []
    for i in range(min(least, len(prefix) + 1)):
        if i < len(prefix):
            needs.append([f"{pointer}/prefixItems/{i}"])
        elif isinstance(items, (dict, bool)):
            needs.append([f"{pointer}/items"])
    return needs


def _why_not(needs: dict[str, list[list[str]] | None], matches: set[str]) -> str:
    """The path from the whole schema down to what matches nothing: a loop, or a schema matching nothing."""
    path = ["#"]
    while True:
        groups = needs.get(path[-1])
        missing = next((g for g in groups or () if not any(child in matches for child in g)), None)
        if groups is None or missing is None:
            return " -> ".join(map(_shown, path)) + ", which matches nothing"
        if not missing:
            return " -> ".join(map(_shown, path)) + ", which requires a property it does not allow"
        step = missing[0]
        if step in path:
            return " -> ".join(map(_shown, [*path, step])) + f": a loop back to {_shown(step)} with no value in between"
        path.append(step)


def _check_metaschema(schema: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:
        return
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        pointer = "#" + "".join("/" + _escape(str(p)) for p in e.absolute_path)
        raise SchemaProblem(f"not a valid JSON Schema: {e.message}", pointer) from None


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _shown(pointer: str) -> str:
    """A pointer for a message: a very deep one keeps its start and end."""
    return pointer if len(pointer) <= 120 else f"{pointer[:50]}...{pointer[-60:]}"


# -- the run's schema, stored once and referenced ---------------------------------------------------


def schema_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def schema_reference(text: str) -> dict[str, str]:
    """What a request line carries in place of the schema `text`."""
    return {"$ref": SCHEMA_URN + schema_digest(text)}


def referenced_digest(schema: Any) -> str | None:
    """The digest a schema reference names (None: `schema` is not one)."""
    ref = schema.get("$ref") if isinstance(schema, dict) and len(schema) == 1 else None
    return ref[len(SCHEMA_URN) :] if isinstance(ref, str) and ref.startswith(SCHEMA_URN) else None


def referenced(response_format: Any) -> Any:
    """A response_format as the run stores it: a json_schema's schema replaced by its reference
    (any other response_format as it is)."""
    schema = json_schema_of(response_format)
    if schema is None or referenced_digest(schema) is not None:
        return response_format
    return with_schema(response_format, schema_reference(schema_text(schema)))


def with_schema(response_format: Any, schema: Any) -> dict[str, Any]:
    """A json_schema response_format (json_schema_of found its schema) with `json_schema.schema` replaced."""
    return {**response_format, "json_schema": {**response_format["json_schema"], "schema": schema}}


def json_schema_of(response_format: Any) -> Any:
    """A json_schema response_format's schema (None for any other response_format)."""
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        return spec.get("schema") if isinstance(spec, dict) else None
    return None


class RunSchemas:
    """The schemas a run's request lines may reference, by digest: the spec's `input.response_format`
    schema. `resolved` turns a body's reference back into the schema (the same object each time: a
    row costs no copy)."""

    def __init__(self, schemas: Mapping[str, Any] | None = None):
        self.by_digest = dict(schemas or {})

    @classmethod
    def of(cls, response_format: Any) -> RunSchemas:
        """The schemas of a spec's `input.response_format` (none when it has no schema)."""
        schema = json_schema_of(response_format)
        if schema is None or referenced_digest(schema) is not None:
            return cls()
        return cls({schema_digest(schema_text(schema)): schema})

    def __bool__(self) -> bool:
        return bool(self.by_digest)

    def resolved(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with its response_format's schema reference replaced by the schema; `body` itself
        when it holds none. A reference to a schema the run does not have raises a SchemaProblem."""
        response_format = body.get("response_format")
        digest = referenced_digest(json_schema_of(response_format))
        if digest is None:
            return body
        schema = self.by_digest.get(digest)
        if schema is None:
            raise SchemaProblem(
                f"the schema {SCHEMA_URN}{digest} is not the run's (runs/<run>/schemas/ holds the run's schema)",
                "#",
            )
        return {**body, "response_format": with_schema(response_format, schema)}

    def inflated_line(self, line: bytes) -> bytes:
        """A request line with the schema in place of its reference: a line that leaves the run (the
        retry file, a cascade's next stage) is a whole OpenAI Batch request, as vLLM's run_batch reads it."""
        if SCHEMA_URN.encode() not in line:
            return line
        request = json.loads(line)
        body = request.get("body")
        if isinstance(body, dict):
            request["body"] = self.resolved(body)
        return (json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

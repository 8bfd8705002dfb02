"""`orch collect`'s table: one row per input row, the columns a user queries, a JSON schema's fields typed.

Columns, in this order:
    <id>                the row's custom_id, named after input.id_column when the run has one
    <kept>...           the input columns `--keep-columns` names, read from the run's input again
    text                the answer (a pooling run has `embeddings` instead, one vector per input)
    <field>..., parse_error
                        a run whose requests carry a json_schema response_format: each of the
                        schema's properties as a typed column (a schema that is not an object: one
                        column named after it); a field whose value is not JSON, breaks the schema
                        or does not fit its column is null, and `parse_error` names it and says why
    finish_reason, prompt_tokens, completion_tokens, error_code, error_message
    model               the served name (core/model_source.served_name), never a path
    reused              whether an earlier run answered the row (--reuse-from); false in any other run
    escalated           why a cascade's row went on to a later model (null where the first answered it,
                        and in a run that is not a cascade)
`reused` and `escalated` are in every table, whatever the run: a table that grows run after run
(sinks.py) keeps the same columns whether a week's run reused answers, cascaded or not.
A kept column named as one of these is written `input_<name>`, a schema field `answer_<name>`.
A sweep (spec `sweep.arms`) has one row per input row, its id without `#<arm>`, and the columns
from the answer to `reused` once per arm, `<column>_<arm>` (text_small, text_large, ...), arm by arm.
The wire format (OpenAI Batch lines) stays `--format openai`.

A schema value's column (column_kind): `type` string, integer, number or boolean, arrays of them,
the same made nullable (`type: [integer, "null"]`, `anyOf`/`oneOf` with a `{type: null}` branch, as
pydantic writes optionals), `enum` and `const` of values of one type (null among them allowed),
a local `$ref` (pydantic's `$defs`) followed; integers and numbers mixed are numbers; anything else
(objects, mixed types) JSON text. An integer answered as a whole float (`3.0`, valid JSON Schema
for an integer) is the integer; one beyond the 64-bit range is null, named in `parse_error`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from orchestrator.core.errors import InputError, OutputError
from orchestrator.core.frozen_spec import read_stored_spec
from orchestrator.core.layout import RunLayout
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.model_source import served_name
from orchestrator.core.records import PrepareRecord, read_record
from orchestrator.core.store import Store

#: Rows of a Parquet row group: bounded memory, whatever the run's size.
ROW_GROUP = 10_000
#: JSON Schema types and the kinds of column they become (anything else: JSON text).
_SCALARS = {"string": "string", "integer": "int", "number": "float", "boolean": "bool"}


@dataclass(frozen=True)
class TableSpec:
    """What the table's columns depend on, read from the run's frozen spec (a plain mapping)."""

    id_column: str
    pooling: bool
    model: str
    engine_args: dict[str, Any]
    response_format: dict[str, Any] | None
    kept: KeptColumns | None = None
    #: A sweep's arms, in order: each answer column once per arm, `<column>_<arm>`, one row per input row.
    arms: tuple[str, ...] = ()

    def keeping(self, kept: KeptColumns) -> TableSpec:
        return dataclasses.replace(self, kept=kept)

    @classmethod
    def of(cls, spec: dict[str, Any]) -> TableSpec:
        model, spec_input = spec.get("model") or {}, spec.get("input") or {}
        return cls(
            id_column=spec_input.get("id_column") or "custom_id",
            pooling=model.get("runner") == "pooling",
            model=model.get("name") or "",
            engine_args=model.get("engine_args") or {},
            response_format=spec_input.get("response_format"),
            arms=tuple((spec.get("sweep") or {}).get("arms") or ()),
        )


def table_spec(store: Store, layout: RunLayout, container: str, keep_columns: list[str] | None) -> TableSpec:
    """The table's columns, from the run's frozen spec; the kept columns checked against its input."""
    found = read_stored_spec(store, layout)
    spec = TableSpec.of(found[0] if found is not None else {})
    kept = [name for name in keep_columns or [] if name != spec.id_column]  # the id is there once
    return spec if not kept else spec.keeping(KeptColumns(store, layout, kept, typed_columns=container == "parquet"))


def column_kind(schema: Any, root: Any = None, seen: frozenset[str] = frozenset()) -> str:
    """The kind of column a JSON Schema value becomes: string, int, float, bool, list:<scalar>, or
    json (see the module doc). `root`: the schema its `$ref`s point into (default: `schema`)."""
    if not isinstance(schema, dict):
        return "json"
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):  # a loop, or a reference outside this schema: text
        target = _pointer(root, ref) if ref not in seen else None
        return column_kind(target, root, seen | {ref}) if target is not None else "json"
    branches = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(branches, list) and branches:
        return _merged_kind({column_kind(b, root, seen) for b in branches if not _only_null(b)})
    whole = schema.get("allOf")
    if isinstance(whole, list) and len(whole) == 1 and "type" not in schema:  # pydantic 1's `allOf: [{$ref}]`
        return column_kind(whole[0], root, seen)
    kind = schema.get("type")
    if kind is None:
        choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if isinstance(choices, list) and choices:
            return _merged_kind({_value_kind(c) for c in choices} - {"null"})
        return "json"
    kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if k != "null"}
    if kinds == {"array"}:
        item = column_kind(schema.get("items"), root, seen)
        return f"list:{item}" if item in _SCALARS.values() else "json"
    if not all(isinstance(k, str) and k in _SCALARS for k in kinds):
        return "json"
    return _merged_kind({_SCALARS[k] for k in kinds})


def _only_null(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema.get("const", 0) is None)


def _pointer(root: Any, ref: str) -> Any:
    """The value a local `$ref` (`#`, `#/$defs/Name`) points to in `root`; None for any other."""
    if not ref.startswith("#"):
        return None
    found = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(found, dict) and part in found:
            found = found[part]
        elif isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        else:
            return None
    return found


def arrow_type(kind: str) -> Any:
    import pyarrow as pa

    if kind.startswith("list:"):
        return pa.list_(arrow_type(kind.removeprefix("list:")))
    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}.get(kind, pa.string())


def typed(kind: str, value: Any) -> Any:
    """`value` as a column of `kind` holds it (a whole float in an int column: the integer);
    ValueError, saying why, when it is not of that kind or does not fit."""
    if value is None:
        return None
    if kind == "json":
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if kind.startswith("list:"):
        if not isinstance(value, list):
            raise ValueError(f"expected an array, got {type(value).__name__}")
        return [typed(kind.removeprefix("list:"), v) for v in value]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if kind == "int" and number and isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ValueError(f"{_shown(value)} does not fit a 64-bit integer column")
    fits = {
        "string": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": number and isinstance(value, int),
        "float": number,
    }[kind]
    if not fits:
        raise ValueError(f"expected {kind}, got {_shown(value)}")
    if kind == "float":
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{_shown(value)} does not fit a 64-bit float column") from None
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


class AnswerFields:
    """A json_schema response_format's fields: each answer parsed, checked and split into typed values."""

    def __init__(self, json_schema: dict[str, Any], taken: set[str]):
        schema = json_schema.get("schema") or {}
        body = _pointer(schema, schema["$ref"]) if isinstance(schema.get("$ref"), str) else schema
        properties = (
            body.get("properties") if isinstance(body, dict) and body.get("type", "object") == "object" else None
        )
        self.whole = not isinstance(properties, dict)  # one column for the whole answer
        fields: dict[str, Any] = properties if isinstance(properties, dict) else {}
        if self.whole:
            fields = {str(json_schema.get("name") or "answer"): schema}
        self.fields = [(_free(name, taken), name, column_kind(sub, schema)) for name, sub in fields.items()]
        self.validator = _validator(schema)

    def columns(self) -> list[tuple[str, str]]:
        return [(column, kind) for column, _name, kind in self.fields]

    def parse(self, text: str | None, finish_reason: Any) -> tuple[list[Any], str | None]:
        """The fields' values, and None or what is wrong. A field that breaks the schema or does
        not fit its column is null, named in what is wrong, and the other fields keep their values;
        an answer that is not JSON (or not an object) leaves every field null."""
        nothing = [None] * len(self.fields)
        if text is None:
            return nothing, None
        try:
            answer = json.loads(text)
        except ValueError as e:
            cut = " (the answer was cut at max_tokens)" if finish_reason == "length" else ""
            return nothing, f"not JSON: {getattr(e, 'msg', e)}{cut}"
        if not self.whole and not isinstance(answer, dict):
            return nothing, f"expected an object, got {type(answer).__name__}"
        problems = self._schema_problems(answer)
        values: list[Any] = []
        for _column, name, kind in self.fields:
            key = "" if self.whole else name
            if key in problems and not self.whole:
                values.append(None)
                continue
            try:
                values.append(typed(kind, answer if self.whole else answer.get(name)))
            except ValueError as e:
                values.append(None)
                problems.setdefault(key, f"{name}: {e}")
        if self.whole and problems:
            values = nothing
        return values, "; ".join(problems.values()) or None

    def _schema_problems(self, answer: Any) -> dict[str, str]:
        """The first problem the schema finds in each field ("" for the top level), as said."""
        if self.validator is None:
            return {}
        problems: dict[str, str] = {}
        try:
            for problem in self.validator.iter_errors(answer):
                path = list(problem.absolute_path)
                key = "" if self.whole or not path else str(path[0])
                at = "/".join(map(str, path)) or "the top level"
                message = problem.message if len(problem.message) <= 200 else problem.message[:197] + "..."
                problems.setdefault(key, f"does not hold to the schema at {at}: {message}")
        except RecursionError:
            problems[""] = "the schema could not be checked: its references loop"
        return problems


def _validator(schema: dict[str, Any]) -> Any:
    try:
        import jsonschema
    except ImportError:  # the types are still checked, field by field
        return None
    return jsonschema.validators.validator_for(schema)(schema)


def _free(name: str, taken: set[str]) -> str:
    """`name`, or `answer_<name>` where another column has it; taken from then on."""
    column = name if name not in taken else f"answer_{name}"
    taken.add(column)
    return column


class KeptColumns:
    """The input columns `--keep-columns` names, read from the run's input again (prepare keeps no
    copy of it), in input order: `at(position)` gives a row's values. The input must be the one
    prepared (size and content digest, as prepare checks them)."""

    def __init__(self, store: Store, layout: RunLayout, names: list[str], typed_columns: bool):
        from orchestrator.prepare.identity import input_differences
        from orchestrator.prepare.sources import resolve_sources

        found = read_record(store, layout.prepare_record, PrepareRecord)
        sources = found[0].identity.get("sources", []) if found is not None else []
        self.names = names
        try:
            self.files = resolve_sources([s["uri"] for s in sources])
            changed = input_differences(found[0].identity if found else {}, self.files)
        except InputError as e:
            raise _unreadable(e.message, e.where) from None
        if changed:
            raise _unreadable("it changed since prepare: " + "; ".join(changed), None)
        kinds = self._kinds()  # also refuses a column the input does not have
        self.kinds = kinds if typed_columns else ["raw"] * len(names)
        self.rows = self._rows()
        self.position = -1
        self.values: list[Any] = [None] * len(names)

    def columns(self) -> list[tuple[str, str]]:
        return list(zip(self.names, self.kinds, strict=True))

    def at(self, position: int | None) -> list[Any]:
        if position is None:
            raise OutputError(
                "--keep-columns: this run was prepared by an orch that kept no row positions",
                hint="prepare the input again under a new --run name, or collect without --keep-columns",
            )
        while self.position < position:
            self.position, record = next(self.rows, (position, None))
            self.values = [record.get(name) if record is not None else None for name in self.names]
        return [v if kind == "raw" else typed(kind, v) for kind, v in zip(self.kinds, self.values, strict=True)]

    def _rows(self) -> Iterator[tuple[int, dict[str, Any] | None]]:
        from orchestrator.prepare.source_file import COLUMNAR_KINDS
        from orchestrator.prepare.sources import iter_rows

        position = 0
        try:
            for source in self.files:
                for raw in iter_rows(source, self.names if source.kind in COLUMNAR_KINDS else None):
                    yield position, raw.record
                    position += 1
        except InputError as e:  # a Parquet file without the column lists those it has
            raise OutputError(f"--keep-columns: {e.message}", where=e.where) from None

    def _kinds(self) -> list[str]:
        """A first pass: each column's kind over the whole input (int and float mixed: float; any
        other mix, arrays and objects: JSON text); a column no row has is refused, listing those there are."""
        seen: list[set[str]] = [set() for _ in self.names]
        present: set[str] = set()
        for _position, record in self._rows():
            if record is None:
                continue
            present.update(record)
            for found, name in zip(seen, self.names, strict=True):
                found.add(_value_kind(record.get(name)))
        missing = [name for name in self.names if name not in present]
        if missing:
            files = ", ".join(f.uri for f in self.files)
            raise OutputError(
                f"--keep-columns: no column {', '.join(map(repr, missing))} in the run's input ({files})",
                hint=f"its columns: {', '.join(sorted(present)) or '(none)'}",
            )
        return [_merged_kind(found - {"null"}) for found in seen]


def _value_kind(value: Any) -> str:
    """The kind of column a JSON value alone would be (null for None; an integer beyond 64 bits: JSON text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -(2**63) <= value < 2**63 else "json"
    return "float" if isinstance(value, float) else "string" if isinstance(value, str) else "json"


def _merged_kind(kinds: set[str]) -> str:
    """One column for values of these kinds: the one kind, a number for int and float, else JSON text."""
    if kinds == {"int", "float"}:
        return "float"
    return next(iter(kinds)) if len(kinds) == 1 else ("string" if not kinds else "json")


def _unreadable(message: str, where: str | None) -> OutputError:
    return OutputError(
        f"--keep-columns reads the run's input again, and cannot: {message}",
        where=where,
        hint="collect from where prepare ran, with the input it read (or without --keep-columns)",
    )


class TableWriter:
    """The table's rows, as Parquet row groups or JSON lines, into `file` (the caller publishes it)."""

    def __init__(self, file: IO[bytes], container: str, spec: TableSpec):
        self.file, self.container, self.spec, self.kept = file, container, spec, spec.kept
        fixed = {spec.id_column, "text", "embeddings", "parse_error", *_TAIL}
        columns = [(spec.id_column, "string")]
        kept = spec.kept.columns() if spec.kept else []
        columns += [(f"input_{name}" if name in fixed else name, kind) for name, kind in kept]
        taken = fixed | {name for name, _ in columns}
        fmt = spec.response_format or {}
        self.fields = AnswerFields(fmt["json_schema"], taken) if fmt.get("type") == "json_schema" else None
        answer = [("embeddings", "embeddings") if spec.pooling else ("text", "string")]
        if self.fields is not None:
            answer += [*self.fields.columns(), ("parse_error", "string")]
        answer += [*_TAIL.items(), ("reused", "bool")]
        if spec.arms:  # a sweep: a row's arms side by side, each arm reused or run on its own
            answer = [(f"{name}_{arm}", kind) for arm in spec.arms for name, kind in answer]
        self.columns = columns + answer
        self.columns += [] if spec.arms else [("escalated", "string")]
        self.rows: list[list[Any]] = []
        self.parquet: Any = None
        #: A sweep: the row whose arms are being gathered (its id, position, each arm's values).
        self.gathering: tuple[str, int | None, dict[str, list[Any]]] | None = None

    def add(
        self, line: BatchOutputLine, position: int | None = None, *, reused: bool = False, escalated: str | None = None
    ) -> None:
        answer = [*self._answer(line), reused]
        if not self.spec.arms:  # (a cascade has no arms)
            self._write([line.custom_id, *(self.kept.at(position) if self.kept else []), *answer, escalated])
            return
        # Arms come one after the other (positions row x arms + arm): gather a row's, then write it.
        row_id, _, arm = (line.custom_id or "").rpartition("#")
        row_position = None if position is None else position // len(self.spec.arms)
        if self.gathering is not None and (self.gathering[0], self.gathering[1]) != (row_id, row_position):
            self._write_gathered()
        if self.gathering is None:
            self.gathering = (row_id, row_position, {})
        self.gathering[2][arm] = answer

    def _write_gathered(self) -> None:
        if self.gathering is None:
            return
        row_id, position, arms = self.gathering
        self.gathering = None
        width = (len(self.columns) - 1 - (len(self.kept.columns()) if self.kept else 0)) // len(self.spec.arms)
        row = [row_id, *(self.kept.at(position) if self.kept else [])]
        for arm in self.spec.arms:
            row += arms.get(arm, [None] * width)  # an arm with no line (a partial collect): nulls
        self._write(row)

    def _answer(self, line: BatchOutputLine) -> list[Any]:
        """The columns after the id and the kept ones: the answer, its fields, the tail."""
        body = line.response.body if line.response is not None and line.response.body else {}
        finish = line.first_choice().get("finish_reason")
        row: list[Any] = []
        text = line.text()
        row.append(line.embeddings() if self.spec.pooling else text)
        if self.fields is not None:
            values, problem = self.fields.parse(None if line.failed else text, finish)
            row += [*values, problem]
        usage = line.usage() if "usage" in body else None
        model = body.get("model")
        if isinstance(model, str):  # outputs of an older worker carry the weights' path
            model = served_name(model, self.spec.engine_args if model == self.spec.model else {})
        row += [
            finish,
            usage.prompt_tokens if usage else None,
            usage.completion_tokens if usage else None,
            line.error.code if line.error else None,
            line.error.message if line.error else None,
            model if isinstance(model, str) else None,
        ]
        return row

    def _write(self, row: list[Any]) -> None:
        if self.container == "jsonl":
            record = dict(zip((name for name, _ in self.columns), row, strict=True))
            self.file.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
            return
        self.rows.append(row)
        if len(self.rows) >= ROW_GROUP:
            self._flush()

    def finish(self) -> None:
        self._write_gathered()
        if self.container == "parquet":
            self._flush()
            if self.parquet is None:  # no rows at all: still a valid, empty table
                import pyarrow.parquet as pq

                self.parquet = pq.ParquetWriter(self.file, self._schema())
            self.parquet.close()

    def _schema(self) -> Any:
        import pyarrow as pa

        vectors = pa.list_(pa.list_(pa.float32()))  # one vector per input of an embeddings line
        return pa.schema([(name, vectors if kind == "embeddings" else arrow_type(kind)) for name, kind in self.columns])

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.rows:
            return
        schema = self._schema()
        table = pa.table([list(column) for column in zip(*self.rows, strict=True)], schema=schema)
        if self.parquet is None:
            self.parquet = pq.ParquetWriter(self.file, schema, compression="zstd")
        self.parquet.write_table(table)
        self.rows = []


#: The columns after the answer, and their kinds.
_TAIL = {
    "finish_reason": "string",
    "prompt_tokens": "int",
    "completion_tokens": "int",
    "error_code": "string",
    "error_message": "string",
    "model": "string",
}

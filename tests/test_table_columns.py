"""collect's table: a typed column for every schema shape a user writes, and a parse_error that names the field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.cli import main
from orchestrator.collect.table import column_kind
from orchestrator.core.store import open_store
from tests.support.runs import Answer, answer_chunk, chat_request, make_run

#: What pydantic writes for `label: Label`, `maybe: Label | None`, `count: int | None = None`.
SHAPES = {
    "type": "object",
    "properties": {
        "stars": {"enum": [1, 2, 3]},
        "version": {"const": 5},
        "ok": {"enum": [True, False]},
        "ratio": {"enum": [0.5, 1]},
        "tag": {"enum": ["a", "b", None]},
        "mixed": {"enum": [1, "one"]},
        "count": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "label": {"$ref": "#/$defs/Label"},
        "maybe": {"anyOf": [{"$ref": "#/$defs/Label"}, {"type": "null"}], "default": None},
        "score": {"type": ["integer", "null"]},
        "big": {"type": "integer"},
        "labels": {"type": "array", "items": {"$ref": "#/$defs/Label"}},
    },
    "required": ["stars", "version", "ok", "ratio", "tag", "mixed", "count", "label", "maybe", "score", "big"],
    "additionalProperties": False,
    "$defs": {"Label": {"enum": ["x", "y"], "title": "Label", "type": "string"}},
}
GOOD = {
    "stars": 2.0,  # an integer answered as a whole float: valid JSON Schema for an integer
    "version": 5,
    "ok": False,
    "ratio": 1,
    "tag": None,
    "mixed": "one",
    "count": 3.0,
    "label": "x",
    "maybe": "y",
    "score": None,
    "big": 7,
    "labels": ["x", "y"],
}


def schema_run(tmp_path, answers: dict[str, str]) -> str:
    """A run whose requests carry SHAPES as their json_schema, each row answered with `answers[id]`."""
    store_uri = str(tmp_path / "s")
    store = open_store(store_uri)
    fmt = {"type": "json_schema", "json_schema": {"name": "shapes", "schema": SHAPES, "strict": True}}
    requests = [chat_request(cid, f"question {cid}", response_format=fmt) for cid in answers]
    layout = make_run(store, "shapes", [requests], model="m", spec_flags={"input.response_format": fmt})
    answer_chunk(store, layout, "part_00000", [[Answer(i, cid, text) for i, (cid, text) in enumerate(answers.items())]])
    return store_uri


def test_table_types_every_schema_shape_and_names_the_field_that_does_not_fit(tmp_path, capsys):
    store_uri = schema_run(
        tmp_path,
        {
            "r0": json.dumps(GOOD),
            "r1": json.dumps({**GOOD, "big": 2**70}),  # valid JSON Schema, beyond an int64 column
            "r2": json.dumps({**GOOD, "stars": 4, "count": "many"}),  # two fields break the schema
            "r3": '{"stars": ',  # not JSON
        },
    )
    out = tmp_path / "t.parquet"
    assert main(["collect", "--run", "shapes", "--store", store_uri, "--out", str(out)]) == 0, capsys.readouterr().err
    table = pq.read_table(out)
    types = {f.name: f.type for f in table.schema}
    assert {name: types[name] for name in SHAPES["properties"]} == {
        "stars": pa.int64(),
        "version": pa.int64(),
        "ok": pa.bool_(),
        "ratio": pa.float64(),
        "tag": pa.string(),
        "mixed": pa.string(),  # values of two types: JSON text
        "count": pa.int64(),
        "label": pa.string(),
        "maybe": pa.string(),
        "score": pa.int64(),
        "big": pa.int64(),
        "labels": pa.list_(pa.string()),
    }
    rows = {row["custom_id"]: row for row in table.to_pylist()}
    fields = list(SHAPES["properties"])
    assert {k: rows["r0"][k] for k in fields} == {**GOOD, "stars": 2, "ratio": 1.0, "count": 3}
    assert rows["r0"]["parse_error"] is None
    # One field that does not fit its column is null and named; the row's other fields keep their values.
    assert rows["r1"]["big"] is None and rows["r1"]["stars"] == 2 and rows["r1"]["labels"] == ["x", "y"]
    assert rows["r1"]["parse_error"] == "big: 1180591620717411303424 does not fit a 64-bit integer column"
    assert rows["r2"]["stars"] is None and rows["r2"]["count"] is None and rows["r2"]["label"] == "x"
    problems = rows["r2"]["parse_error"].split("; ")
    assert [p.split(":")[0] for p in problems] == [
        "does not hold to the schema at stars",
        "does not hold to the schema at count",
    ], problems
    assert "4 is not one of [1, 2, 3]" in problems[0]
    assert all(rows["r3"][k] is None for k in fields) and rows["r3"]["parse_error"].startswith("not JSON")


@pytest.mark.parametrize(
    ("schema", "kind"),
    [
        ({"enum": [1, 2, 3]}, "int"),
        ({"const": 5}, "int"),
        ({"const": "a"}, "string"),
        ({"enum": [True, False]}, "bool"),
        ({"enum": [0.5, 1.5]}, "float"),
        ({"enum": [1, 2.5]}, "float"),
        ({"enum": ["a", None]}, "string"),
        ({"enum": [1, "a"]}, "json"),
        ({"const": {"a": 1}}, "json"),
        ({"type": ["integer", "null"]}, "int"),
        ({"type": ["integer", "number"]}, "float"),
        ({"type": ["integer", "string"]}, "json"),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "int"),
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "float"),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "json"),
        ({"allOf": [{"$ref": "#/$defs/L"}]}, "string"),
        ({"$ref": "#/$defs/L"}, "string"),
        ({"$ref": "#/$defs/Loop"}, "json"),
        ({"$ref": "other.json#/L"}, "json"),
        ({"type": "array", "items": {"enum": [1, 2]}}, "list:int"),
        ({"type": "array", "items": {"type": "object"}}, "json"),
        ({"type": "object", "properties": {}}, "json"),
    ],
)
def test_column_kind_of_each_schema_shape(schema, kind):
    root = {**schema, "$defs": {"L": {"enum": ["x", "y"]}, "Loop": {"$ref": "#/$defs/Loop"}}}
    assert column_kind(root) == kind


def test_table_columns_are_the_same_for_plain_reuse_and_cascade_runs():
    """A table that grows week after week keeps its columns whatever the week's run was: `reused`
    and `escalated` are always there (a sweep's arms: `reused_<arm>` always)."""
    import io

    from orchestrator.collect.table import TableSpec, TableWriter

    def columns(spec: dict) -> list[tuple[str, str]]:
        base = {"model": {"name": "m"}, "input": {"id_column": "id"}}
        return TableWriter(io.BytesIO(), "parquet", TableSpec.of({**base, **spec})).columns

    plain = columns({})
    assert columns({"reuse": {"runs": ["w1"]}}) == plain
    assert columns({"sweep": {"cascade": [{"model": "small"}, {"model": "large"}]}}) == plain
    assert [name for name, _ in plain][-2:] == ["reused", "escalated"]
    arms = {"sweep": {"arms": {"a": {}, "b": {}}}}
    assert columns({**arms, "reuse": {"runs": ["w1"]}}) == columns(arms)
    assert ("reused_b", "bool") in columns(arms)

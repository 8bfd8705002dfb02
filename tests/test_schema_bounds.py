"""A JSON schema from the user's side: the one check (core/request/json_schema.py) refuses, at prepare and
with where, what the workers would refuse or answer with nothing; the spec's schema is stored once
in the run, each line naming it, and what leaves the run (the retry file) carries it whole."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from orchestrator.cli import main
from orchestrator.core.layout import RunLayout
from orchestrator.core.request.json_schema import MAX_SCHEMA_BYTES, RunSchemas, check_json_schema, schema_text
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store import open_store
from orchestrator.prepare.answers.answer_keys import AnswerKeys
from tests.support.datasets import write_jsonl

LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
LABEL = {"type": "object", "properties": {"label": {"enum": ["bug", "billing"]}}, "required": ["label"]}


def nested(levels: int) -> dict:
    """A schema of `levels` objects within each other's properties (two JSON levels each)."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def wide(properties: int) -> dict:
    return {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string", "description": "d" * 60} for i in range(properties)},
    }


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no stray orch.yaml from elsewhere
    write_jsonl(tmp_path / "rows.jsonl", [{"text": f"ticket {i}"} for i in range(40)])
    return tmp_path


def prepare(*args: object) -> int:
    return main(["prepare", "rows.jsonl", "--format", "text", "--store", "store", "--num-chunks", "2", *map(str, args)])


def schema_file(here, name: str, schema: object) -> str:
    path = here / f"{name}.json"
    # The standard library cannot write 3,000 levels with its default recursion limit: built by hand.
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)
    return str(path)


@pytest.mark.parametrize(
    ("name", "schema", "said"),
    [
        ("deep50", nested(50), "at #/properties/a/properties/a/"),
        ("deep3000", '{"type":"object","properties":{"a":' * 3000 + "{}" + "}}" * 3000, "nest deeper than the 64"),
        ("huge", wide(4000), f"at most {MAX_SCHEMA_BYTES:,} are taken"),
        ("loop", LOOP, "# -> #/$defs/a -> #/$defs/b -> #/$defs/a: a loop back to #/$defs/a"),
        ("needs_itself", {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "# -> "),
        ("dangling", {"$ref": "#/$defs/gone"}, "$ref '#/$defs/gone' points at nothing"),
        ("outside", {"$ref": "https://example.com/s.json"}, "points outside the schema"),
        ("typo", {"type": "object", "properties": {"a": {"type": "strnig"}}}, "at #/properties/a/type: not a valid"),
    ],
)
def test_schema_check_refuses_with_the_file_and_the_place(here, capsys, name, schema, said):
    """Each bound a clear error naming the file and the place in the schema, before any row is read;
    no traceback, nothing written (the 3,000-level file ended prepare in a RecursionError before)."""
    path = schema_file(here, name, schema)
    for check in ([], ["--check"]):
        assert prepare("--run", name, "--json-schema", path, *check) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ERROR {path}: ") and said in err, err
        assert "Traceback" not in err
    assert not os.path.exists(here / "store")


def test_schema_check_of_each_line_names_file_line_and_place(here, capsys):
    """A line's own schema held to the same check: every refused line by file:line, nothing written."""
    rows = []
    for i, schema in enumerate([LABEL, nested(50), LOOP, {"$ref": "urn:orch:schema:sha256:" + "0" * 64}]):
        body = {"messages": [{"role": "user", "content": "x"}], "response_format": _format(schema)}
        rows.append({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    write_jsonl(here / "lines.jsonl", rows)
    args = ["prepare", "lines.jsonl", "--format", "openai-batch", "--run", "l", "--store", "store", "--num-chunks", "1"]
    assert main(args) == 10
    err = capsys.readouterr().err
    assert "3 of 4 request(s) would be refused by the workers" in err
    assert "lines.jsonl:2: response_format's JSON schema: at #/properties/a/properties/a/" in err
    assert "lines.jsonl:3: response_format's JSON schema: no JSON value can match the schema" in err
    assert "lines.jsonl:4: response_format: the schema urn:orch:schema:sha256:000" in err  # only the run's own
    assert not os.path.exists(here / "store")


def test_schema_of_the_spec_is_stored_once_and_each_line_names_it(here, capsys):
    """40 rows with a 160 KB schema: one copy in the run, each line ~200 bytes (before: the schema in
    every line, 58 MB for 40 rows of a 1.4 MB one); spec.yaml holds the reference too, and the
    retry file's lines (a run collected before any worker ran) carry the schema whole again."""
    schema = wide(2000)
    text = schema_text(schema)
    assert prepare("--run", "once", "--json-schema", schema_file(here, "wide", schema)) == 0
    store, layout = open_store("store"), RunLayout("once")
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert store.get(layout.schema(digest)).data == text.encode()
    chunks = [info for info in store.list(f"{layout.root}chunks/")]
    assert sum(info.size for info in chunks) < 40 * 400 < len(text)
    assert len(store.get(layout.spec).data) < 8_000
    reference = {"$ref": f"urn:orch:schema:sha256:{digest}"}
    for info in chunks:
        for raw in store.get(info.key).data.splitlines():
            assert json.loads(raw)["body"]["response_format"]["json_schema"]["schema"] == reference
    capsys.readouterr()
    retry = here / "retry.jsonl"
    assert main(["collect", "--run", "once", "--store", "store", "--out", "o.jsonl", "--retry-out", str(retry)]) != 0
    lines = [json.loads(raw) for raw in retry.read_text().splitlines()]
    assert len(lines) == 40
    assert all(line["body"]["response_format"]["json_schema"]["schema"] == schema for line in lines)


def test_schema_of_the_spec_is_in_the_answer_keys_context():
    """Lines name the schema by digest; the run's key context holds its text's digest too, and a run
    without a schema keys as before (its earlier runs' answers still found)."""
    plain = load_spec(None, {"model.name": "m", "input.format": "text"}, env={}, default_file=False)

    def keyed(schema: dict) -> bytes:
        flags = {"model.name": "m", "input.format": "text", "input.response_format": _format(schema)}
        return AnswerKeys(load_spec(None, flags, env={}, default_file=False)).digest

    assert keyed(LABEL) == keyed(json.loads(json.dumps(LABEL)))
    assert len({keyed(LABEL), keyed({**LABEL, "required": []}), AnswerKeys(plain).digest}) == 3
    assert "response_format" not in AnswerKeys(plain).context


def test_schema_check_remembers_a_schema_that_passed_and_resolves_only_the_runs_own():
    """A schema repeated on every line is checked once; a line's reference resolves to the run's schema
    object itself (no copy per row)."""
    first = check_json_schema(wide(300))
    assert check_json_schema(json.loads(first)) == first
    schemas = RunSchemas.of(_format(LABEL))
    body = {
        "response_format": _format(
            {"$ref": "urn:orch:schema:sha256:" + hashlib.sha256(schema_text(LABEL).encode()).hexdigest()}
        )
    }
    assert schemas.resolved(body)["response_format"]["json_schema"]["schema"] is next(iter(schemas.by_digest.values()))
    assert RunSchemas().resolved({"messages": []}) == {"messages": []}


def _format(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": False}}

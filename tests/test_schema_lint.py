"""A schema's mistakes found the way OpenAI's strict structured outputs finds them (core/request/schema_lint.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from orchestrator.core.request.schema_lint import schema_problems

LABEL = {
    "type": "object",
    "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}, "topic": {"type": "string"}},
    "required": ["urgency", "topic"],
    "additionalProperties": False,
}


def test_schema_lint_a_strict_schema_without_mistakes_has_no_problem():
    assert schema_problems(LABEL, strict=True) == []


def test_schema_lint_names_a_misspelt_keyword_and_a_required_name_without_a_property():
    typo = {
        **LABEL,
        "properties": {"urgency": {"type": "string", "enun": ["low", "high"]}, "topic": {"type": "string"}},
    }
    typo["required"] = ["urgncy", "topic"]
    problems = schema_problems(typo, strict=False)
    assert "/properties/urgency: unknown keyword 'enun' (did you mean 'enum'?)" in problems
    assert "/: required names 'urgncy', which is not one of its properties (did you mean 'urgency'?)" in problems


def test_schema_lint_strict_mode_needs_closed_objects_and_every_property_required_at_every_depth():
    nested = {
        "type": "object",
        "properties": {"who": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "required": ["who"],
        "additionalProperties": False,
    }
    problems = schema_problems(nested, strict=True)
    assert "/properties/who: strict mode needs additionalProperties: false on every object" in problems
    assert any(
        p.startswith("/properties/who: strict mode needs every property in required: add 'name'") for p in problems
    )
    assert schema_problems(nested, strict=False) == []


def test_schema_lint_prepare_refuses_the_mistakes_in_one_round_naming_the_file(tmp_path, capsys):
    """`--json-schema` with a misspelt keyword and a required name without a property: exit 2, the
    file and every mistake with its place and "did you mean", nothing prepared."""
    from orchestrator.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "a", "q": "hi"}\n')
    typo = tmp_path / "label.json"
    typo.write_text(
        json.dumps({**LABEL, "properties": {"urgency": {"enun": ["low", "high"]}, "topic": {}}, "required": ["urgncy"]})
    )
    store = tmp_path / "store"
    flags = ["--format", "text", "--text-column", "q", "--id-column", "id", "--model", "m", "--store", str(store)]
    assert main(["prepare", str(data), "--run", "r", *flags, "--json-schema", str(typo), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{typo}: 2 mistake(s) in the schema" in err
    assert "/properties/urgency: unknown keyword 'enun' (did you mean 'enum'?)" in err
    assert "required names 'urgncy', which is not one of its properties (did you mean 'urgency'?)" in err
    assert not store.exists()


def test_schema_lint_strict_is_set_where_the_schema_meets_its_rules_and_refused_where_asked_and_not_met():
    """--json-schema: strict on the lines where every object is closed and every property required,
    off where not (vLLM holds either); a response_format that says strict: true and does not meet
    them is a spec error naming the rule."""
    import pytest

    from orchestrator.core.errors import SpecError
    from orchestrator.core.request.request_format import check_response_format, response_format_of
    from orchestrator.core.spec_load import load_spec

    def strict_of(schema: dict[str, object], path: Path) -> object:
        path.write_text(json.dumps(schema))
        made = response_format_of(None, str(path))
        assert made is not None
        return made["json_schema"]["strict"]

    here = Path(tempfile.mkdtemp())
    optional = {"type": "object", "properties": {"label": {"type": "string"}}, "required": []}
    assert strict_of(LABEL, here / "closed.json") is True
    assert strict_of(optional, here / "open.json") is False
    asked = {"type": "json_schema", "json_schema": {"name": "s", "schema": optional, "strict": True}}
    with pytest.raises(ValueError, match=r"strict: true.*every property in required: add 'label'"):
        check_response_format(asked)
    with pytest.raises(SpecError, match="additionalProperties: false"):
        load_spec(None, {"model.name": "m", "input.format": "text", "input.response_format": asked}, env={})

"""A schema's mistakes found the way OpenAI's strict structured outputs finds them (core/schema_lint.py)."""

from __future__ import annotations

from orchestrator.core.schema_lint import schema_problems

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

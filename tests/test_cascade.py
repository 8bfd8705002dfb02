"""The cascade (spec `sweep.cascade`): its spec errors, its escalation conditions, stage 2's requests
made once from stage 1's answers, and each row's final answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.controller.cascade import (
    Escalated,
    escalation,
    final_answers,
    next_stage,
    record_stage,
    stage_counts,
)
from orchestrator.core.errors import SpecError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.spec import EscalateSpec
from orchestrator.core.spec_load import load_spec
from orchestrator.core.store.memory import MemoryStore

MODELS = {"small": "x/small", "large": "x/large"}


def answer(custom_id: str, text: str, finish: str = "stop", logprobs: list[float] | None = None) -> BatchOutputLine:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": x} for x in logprobs]}
    body = {"object": "chat.completion", "model": "small", "choices": [choice]}
    return BatchOutputLine.model_validate(
        {"custom_id": custom_id, "response": {"status_code": 200, "request_id": "r", "body": body}}
    )


def request(custom_id: str, **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def spec_error(sweep: dict[str, Any], models: dict[str, str] = MODELS) -> str:
    with pytest.raises(SpecError) as raised:
        load_spec(None, {"models": models, "sweep": sweep}, env={}, default_file=False)
    return str(raised.value)


def test_cascade_spec_errors_name_the_field():
    when = {"finish_reason": ["length"]}
    unknown = spec_error({"cascade": ["small", "huge"], "escalate_when": when})
    assert "sweep.cascade" in unknown and "'huge'" in unknown
    both = spec_error({"cascade": ["small", "large"], "escalate_when": when, "arms": {"a": {}}})
    assert "sweep.cascade" in both and "arms" in both
    assert "sweep.escalate_when" in spec_error({"cascade": ["small", "large"]})
    assert "regex" in spec_error({"cascade": ["small", "large"], "escalate_when": {"regex": "("}})
    spec = load_spec(
        None,
        {"models": MODELS, "sweep": {"cascade": ["small", "large"], "escalate_when": when}},
        env={},
        default_file=False,
    )
    assert spec.sweep.cascade == ["small", "large"]


def test_cascade_escalation_conditions():
    length = EscalateSpec(finish_reason=["length"])
    assert escalation(answer("a", "cut", "length"), {}, length) == "finish_reason length"
    assert escalation(answer("a", "whole"), {}, length) is None
    regex = EscalateSpec(regex=r"(?i)i don't know")
    assert escalation(answer("a", "Well, I don't know."), {}, regex) is not None
    assert escalation(answer("a", "Paris"), {}, regex) is None
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "required": ["x"]}}}
    strict = EscalateSpec(json_schema=True)
    assert "not JSON" in (escalation(answer("a", "{oops"), {"response_format": schema}, strict) or "")
    assert "'x'" in (escalation(answer("a", '{"y": 1}'), {"response_format": schema}, strict) or "")
    assert escalation(answer("a", '{"x": 1}'), {"response_format": schema}, strict) is None
    assert escalation(answer("a", "free text"), {}, strict) is None  # no schema asked: nothing to miss
    sure = EscalateSpec(logprob_below=-1.0)
    assert escalation(answer("a", "t", logprobs=[-0.1, -0.3]), {}, sure) is None
    assert "mean logprob" in (escalation(answer("a", "t", logprobs=[-0.1, -3.0]), {}, sure) or "")
    with pytest.raises(SpecError, match="logprob_below"):
        escalation(answer("a", "t"), {}, sure)


def test_cascade_next_stage_is_made_once_across_a_restart():
    """Stage 2 holds exactly the matching rows, in input order, for the next model; recorded once, a
    second controller (after a crash) gets the same rows back, not a second set."""
    requests = [(2, request("c", model="small")), (0, request("a", model="small")), (1, request("b", model="small"))]
    answers = {"a": answer("a", "x", "length"), "b": answer("b", "fine"), "c": answer("c", "no idea")}
    when = EscalateSpec(finish_reason=["length"], regex="no idea")
    rows = next_stage(requests, answers, when, "large")
    assert [(r.position, json.loads(r.line)["body"]["model"], r.reason) for r in rows] == [
        (0, "large", "finish_reason length"),
        (2, "large", "regex 'no idea'"),
    ]
    store = MemoryStore()
    assert record_stage(store, "runs/r", 1, rows) == rows
    other = [Escalated(1, request("b"), "made again")]
    assert record_stage(store, "runs/r", 1, other) == rows  # the first record wins
    with pytest.raises(ValueError, match="not finished"):
        next_stage(requests, {"a": answers["a"]}, when, "large")


def test_cascade_final_answer_is_the_last_stage_that_answered():
    small = {"a": answer("a", "x", "length"), "b": answer("b", "fine")}
    large = {"a": answer("a", "a longer answer")}
    finals = final_answers([("small", small), ("large", large)], [{"a": "finish_reason length"}])
    assert (finals["a"].model, finals["a"].escalated, finals["a"].line.text()) == (
        "large",
        "finish_reason length",
        "a longer answer",
    )
    assert (finals["b"].model, finals["b"].escalated) == ("small", None)
    assert stage_counts(finals, ["small", "large"]) == {
        "small": {"answered": 2, "escalated": 1},
        "large": {"answered": 1, "escalated": 0},
    }


def test_cascade_run_is_refused_before_anything_is_written(tmp_path):
    """Running a cascade is not built: prepare must refuse it, naming the field, rather than run
    stage 1 alone and hand its answers out as the cascade's."""
    from tests.test_faults import orch

    (tmp_path / "orch.yaml").write_text(
        "models: {small: x/small, large: x/large}\n"
        "sweep: {cascade: [small, large], escalate_when: {finish_reason: [length]}}\n"
    )
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q0", "text": "hi"}) + "\n")
    done = orch("prepare", data, "--run", "c", "--store", tmp_path / "store", "--format", "text", cwd=tmp_path)
    assert done.returncode != 0 and "sweep.cascade" in done.stderr + done.stdout
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("manifest*"))

"""A cascade's rule (spec `sweep.escalate_when`): which of stage n's answers go on to stage n+1, and as what.

Stage n+1's requests are made from stage n's finished answers: the rows whose answer meets a
condition (finish_reason, a json_schema not met, a regex, a mean token logprob below a bound), in
input order, each with its body.model set to the next model. Making them is deterministic (same
answers, same requests): fleet/cascade.py records the result once, so no row is escalated twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import SpecError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import EscalateSpec


def escalation(line: BatchOutputLine, body: Mapping[str, Any], when: EscalateSpec) -> str | None:
    """Why the answer `line` to a request with `body` goes to the next model, None when it stays.
    A failed row stays: it is an error row, redone by `orch redo`, not a weak answer."""
    if line.failed:
        return None
    choice = line.first_choice()
    finish = choice.get("finish_reason")
    if finish in when.finish_reason:
        return f"finish_reason {finish}"
    text = line.text() or ""
    if when.json_schema and (unmet := _schema_unmet(text, body)):
        return f"json_schema: {unmet}"
    if when.regex is not None and re.search(when.regex, text):
        return f"regex {when.regex!r}"
    if when.logprob_below is not None:
        mean = _mean_logprob(choice, line.custom_id)
        if mean < when.logprob_below:
            return f"mean logprob {mean:.3f} < {when.logprob_below}"
    return None


def _schema_unmet(text: str, body: Mapping[str, Any]) -> str | None:
    """What is wrong with `text` against the row's json_schema response_format; None when it is met
    or the row asked for no schema (nothing to check)."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg})"
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    return error.message if error is not None else None


def _mean_logprob(choice: Mapping[str, Any], custom_id: str | None) -> float:
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content:
        raise SpecError(
            f"row {custom_id!r} has no logprobs to compare",
            hint='request them in each row\'s body ("logprobs": true)',
            where="sweep.escalate_when.logprob_below",
        )
    return sum(float(token["logprob"]) for token in content) / len(content)


@dataclass(frozen=True)
class Escalated:
    """A row sent to the next stage: its input position, its request line for that stage, and why."""

    position: int
    line: str
    reason: str


def next_stage(
    requests: Iterable[tuple[int, str]],
    answers: Mapping[str, BatchOutputLine],
    when: EscalateSpec,
    model: str,
    schemas: RunSchemas | None = None,
) -> list[Escalated]:
    """Stage n+1's requests from stage n's: `requests` are (input position, request line), `answers`
    stage n's output lines by custom_id. In input order; a request with no answer yet is a bug in
    the caller (stage n is not done), reported rather than skipped. `schemas`: the run's, so a
    line's schema reference is checked against (and, escalated, carries) the schema itself: the
    next stage is a run of its own, its input whole OpenAI Batch lines."""
    escalated = []
    for position, request_line in sorted(requests):
        request = json.loads(request_line)
        answer = answers.get(request["custom_id"])
        if answer is None:
            raise ValueError(f"stage not finished: no answer for {request['custom_id']!r}")
        request["body"] = (schemas or RunSchemas()).resolved(request["body"])
        reason = escalation(answer, request["body"], when)
        if reason is not None:
            request["body"] = {**request["body"], "model": model}
            escalated.append(Escalated(position, json.dumps(request, ensure_ascii=False), reason))
    return escalated

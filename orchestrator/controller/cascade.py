"""A cascade (spec `sweep.cascade`): every row answered by the first model, rows matching escalate_when sent on.

Stage n+1's requests are made from stage n's finished answers: the rows whose answer meets a
condition (finish_reason, a json_schema not met, a regex, a mean token logprob below a bound), in
input order, each with its body.model set to the next model. Making them is deterministic (same
answers, same requests), and the result is recorded in the store with put_if_absent under the
stage's key: a controller that crashes after recording it and starts again reads the record back
instead of making a second one, so no row is escalated twice. Collect takes, for each row, the
answer of the last stage that answered it, with the reason it was escalated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import NotFound, PreconditionFailed, SpecError
from orchestrator.core.lines import BatchOutputLine
from orchestrator.core.spec import EscalateSpec
from orchestrator.core.store.base import Store


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
) -> list[Escalated]:
    """Stage n+1's requests from stage n's: `requests` are (input position, request line), `answers`
    stage n's output lines by custom_id. In input order; a request with no answer yet is a bug in
    the caller (stage n is not done), reported rather than skipped."""
    escalated = []
    for position, request_line in sorted(requests):
        request = json.loads(request_line)
        answer = answers.get(request["custom_id"])
        if answer is None:
            raise ValueError(f"stage not finished: no answer for {request['custom_id']!r}")
        reason = escalation(answer, request["body"], when)
        if reason is not None:
            request["body"] = {**request["body"], "model": model}
            escalated.append(Escalated(position, json.dumps(request, ensure_ascii=False), reason))
    return escalated


def stage_key(run_prefix: str, stage: int) -> str:
    return f"{run_prefix}/cascade/stage-{stage}.json"


def record_stage(store: Store, run_prefix: str, stage: int, rows: Sequence[Escalated]) -> list[Escalated]:
    """Record stage `stage`'s requests once: the first record wins, and every later call (a
    controller started again after a crash) gets that record back, never a second set of rows."""
    key = stage_key(run_prefix, stage)
    data = json.dumps([[r.position, r.line, r.reason] for r in rows], ensure_ascii=False).encode()
    try:
        store.put_if_absent(key, data)
        return list(rows)
    except PreconditionFailed:
        return read_stage(store, run_prefix, stage) or []


def read_stage(store: Store, run_prefix: str, stage: int) -> list[Escalated] | None:
    """Stage `stage`'s recorded requests, None while it is not recorded (stage n-1 not yet done)."""
    try:
        data = store.get(stage_key(run_prefix, stage)).data
    except NotFound:
        return None
    return [Escalated(p, line, reason) for p, line, reason in json.loads(data)]


@dataclass(frozen=True)
class Final:
    """A row's answer in the output: the last stage's that answered it, and why it was escalated."""

    line: BatchOutputLine
    model: str
    escalated: str | None


def final_answers(
    stages: Sequence[tuple[str, Mapping[str, BatchOutputLine]]], reasons: Sequence[Mapping[str, str]]
) -> dict[str, Final]:
    """Each custom_id's final answer: `stages` are (model, answers by custom_id) in cascade order,
    `reasons[n]` why a custom_id went from stage n to n+1 (the recorded escalations)."""
    finals: dict[str, Final] = {}
    for number, (model, answers) in enumerate(stages):
        for custom_id, line in answers.items():
            why = reasons[number - 1].get(custom_id) if number else None
            finals[custom_id] = Final(line, model, why)
    return finals


def stage_counts(finals: Mapping[str, Final], order: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per model of the cascade: rows it answered, and rows of those it passed on to the next."""
    counts = {model: {"answered": 0, "escalated": 0} for model in order}
    for final in finals.values():
        last = order.index(final.model)
        for number, model in enumerate(order[: last + 1]):
            counts[model]["answered"] += 1
            counts[model]["escalated"] += number < last
    return counts

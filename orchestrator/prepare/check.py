"""Prepare's request check: every request line held to the worker's own request models before anything is written.

A line the workers would answer with an error row (an unknown field, a value out of range, a JSON
schema too large, too deep, with a `$ref` loop or that no value matches, a model the run does not
serve) is found here, on the controller, before any GPU is paid for. The rules are the worker's
(worker/requests.py, worker/bodies.py, worker/structured.py and the schema check they share,
core/request/json_schema.py; worker/adapters.py: engine-free, so the controller imports them). Every
problem is counted, grouped by field, with the first few file:line examples.

The cost stays small on millions of lines: a body's parameters (all but its messages or prompt)
repeat across many lines, so they are checked once per distinct set; only the content is checked
on each line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.core.errors import RequestsRefused
from orchestrator.core.request.json_schema import RunSchemas
from orchestrator.core.spec import RunSpec
from orchestrator.prepare.formats import Request
from worker.adapters import model_problem
from worker.requests import CONTENT_FIELDS, body_problems, content_problem
from worker.wire import BadRequest

#: A valid stand-in for a line's content while its parameters are checked on their own.
_STAND_IN: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}], "prompt": "x"}
#: Distinct parameter sets remembered; past this the memory is cleared (lines whose parameters all differ).
_CACHE_LIMIT = 100_000


@dataclass
class FieldProblems:
    """The lines one body field is wrong on: how many, and the first few with what is wrong there."""

    name: str
    rows: int = 0
    first: list[str] = field(default_factory=list)


class RequestCheck:
    """The worker's verdict on each request prepare builds, gathered by field."""

    #: Examples kept per field.
    SHOWN = 3

    def __init__(self, spec: RunSpec):
        self.defaults = spec.sampling
        self.unknown_fields = spec.requests.unknown_fields
        self.model, self.adapters = spec.model.name, tuple(spec.model.lora)
        self.schemas = RunSchemas.of(spec.input.response_format)  # what the lines' schema references name
        self.cache: dict[bytes, tuple[BadRequest, ...]] = {}
        self.fields: dict[str, FieldProblems] = {}
        self.checked = 0
        self.refused = 0

    @property
    def ok(self) -> bool:
        return self.refused == 0

    def add(self, request: Request, source: str, number: int) -> None:
        """Check one request, the row at line (or row) `number` of `source`."""
        self.checked += 1
        url, body = request.url, request.body
        content = CONTENT_FIELDS.get(url)
        problems = list(self._parameters(url, body, content))
        if content is not None:
            wrong = content_problem(url, body.get(content))
            if wrong is not None:
                problems.append(wrong)
        if not problems:
            return
        self.refused += 1
        for problem in problems:
            name = problem.param or problem.code
            found = self.fields.setdefault(name, FieldProblems(name))
            found.rows += 1
            if len(found.first) < self.SHOWN:
                found.first.append(f"{source}:{number}: {problem}")

    def _parameters(self, url: str, body: dict[str, Any], content: str | None) -> tuple[BadRequest, ...]:
        """What is wrong with the body but its content, once per distinct set of parameters."""
        if content is None:  # no content field to set apart: each body is its own
            return self._verdict(url, body)
        params = {k: v for k, v in body.items() if k != content}
        try:
            key = url.encode() + orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # what orjson cannot write (an int past 64 bits): checked uncached
            return self._verdict(url, {**params, content: _STAND_IN[content]})
        known = self.cache.get(key)
        if known is None:
            if len(self.cache) >= _CACHE_LIMIT:
                self.cache.clear()
            known = self.cache[key] = self._verdict(url, {**params, content: _STAND_IN[content]})
        return known

    def _verdict(self, url: str, body: dict[str, Any]) -> tuple[BadRequest, ...]:
        problems = body_problems(url, body, self.defaults, self.unknown_fields, self.schemas)
        named = body.get("model")
        wrong_model = model_problem(named if isinstance(named, str) else None, self.model, self.adapters)
        return tuple(problems + ([wrong_model] if wrong_model is not None else []))

    def error(self) -> RequestsRefused:
        """The report of every problem found, as the error prepare stops with."""
        lines = []
        for found in sorted(self.fields.values(), key=lambda f: -f.rows):
            lines.append(f"{found.name}: {found.rows:,} row(s)")
            lines += [f"    {example}" for example in found.first]
            if found.rows > len(found.first):
                lines.append(f"    ... and {found.rows - len(found.first):,} more")
        return RequestsRefused(
            f"{self.refused:,} of {self.checked:,} request(s) would be refused by the workers "
            f"({len(self.fields)} field(s)):\n  " + "\n  ".join(lines),
            hint="fix these fields in the input (or how it is read), then prepare again; nothing was written",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "refused": self.refused,
            "fields": {f.name: {"rows": f.rows, "first": f.first} for f in self.fields.values()},
        }

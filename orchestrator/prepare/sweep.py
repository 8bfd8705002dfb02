"""Prepare for a sweep (spec `sweep.arms`): every input row becomes one request per arm.

An arm changes what a row's request is: its model (a `models:` name), its template or system
prompt, its sampling. Its request's custom_id is the row's with `#<arm>` after it, stable across
runs. Rows are numbered in a space of input position x arm (row p, arm a: p * arms + a), so that
collect writes a row's arms one after the other in input order, and a row set aside at prepare is
set aside once per arm, at each arm's place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core.spec import RunSpec, SamplingSpec
from orchestrator.prepare.formats import Converter, Request, make_converter, rebuilt

#: What a custom_id and its arm are joined with.
ARM_SEPARATOR = "#"


def arm_id(custom_id: str, arm: str) -> str:
    return f"{custom_id}{ARM_SEPARATOR}{arm}"


@dataclass(frozen=True)
class Arm:
    name: str
    #: The model pool answering it (a `models:` name), None in a run of one model.
    pool: str | None
    convert: Callable[[dict[str, Any], str, int], Request]


def sweep_arms(spec: RunSpec) -> list[Arm]:
    """The spec's arms, each with the converter of its own input and sampling."""
    first = next(iter(spec.models), None)
    arms = []
    for name, arm in spec.sweep.arms.items():
        spec_input = spec.input.model_copy(
            update={k: v for k, v in (("template", arm.template), ("system_prompt", arm.system_prompt)) if v}
        )
        pool = arm.model or first
        model = pool if spec.models else spec.model.name
        convert = make_converter(spec_input, spec.sampling, None, spec.model.runner)
        arms.append(Arm(name, pool, _for_arm(convert, name, model, arm.sampling, spec.sampling)))
    return arms


def _for_arm(
    convert: Converter, arm: str, model: str | None, sampling: dict[str, Any], defaults: SamplingSpec
) -> Converter:
    """The arm's request for a row: the row's, with the arm's custom_id, model and sampling. The
    sampling goes into the body: a worker fills a body's missing fields from the run's defaults. The
    model comes first, as in a run of one model's requests: an arm that changes nothing asks what
    such a run asked, byte for byte, so it reuses that run's answers (answer_keys.py)."""

    def converted(record: dict[str, Any], source: str, number: int) -> Request:
        request = convert(record, source, number)
        line = json.loads(request.line)
        named = {"model": model} if model else {}
        body = {**named, **{k: v for k, v in line["body"].items() if k not in named}, **sampling}
        return rebuilt(arm_id(request.custom_id, arm), line["url"], body, request, defaults)

    return converted

"""A batch's input file checked as OpenAI checks it: every problem listed with its line, nothing run if any.

Unlike `orch prepare`, which sets bad rows aside and runs the rest, the Batch API fails the whole
batch (status `failed`, `errors.data`) when any line is wrong, so a client never pays for half a
file it got wrong. The codes and messages are OpenAI's where OpenAI has them:

    invalid_json_line            a line that is not JSON (nested deeper than 200 levels, or holding a
                                 lone surrogate escape such as "\\ud800", counts as not JSON: orch
                                 could not write it out again)
    line_too_large               a line longer than input.max_line_bytes (64 MiB unless set), never read
                                 whole: memory stays bounded whatever the file holds
    missing_required_parameter   no custom_id, method, url, body or body.model
    duplicate_custom_id          a custom_id seen on an earlier line
    invalid_url                  a url other than the batch's endpoint
    model_not_found              a model this server does not serve (the message lists those it does)
    model_not_supported          a served model that does not answer the batch's endpoint (a generating
                                 model for /v1/embeddings, an embedding model for chat...)
    model_mismatch               a model other than the first line's: one model per batch (unless the
                                 server allows several: serve.several_models)
    invalid_request              anything else a request line cannot be (a body without messages...)
    too_many_tasks,              the file as a whole: more requests or bytes than the server's
    file_too_large               limits (serve.max_requests, serve.max_file_bytes)

A file with no request line is no problem: its batch completes with 0 requests, as OpenAI's does
and as `orch run` answers an empty input with an empty output.

After the first 1,000 problems only the count grows: the batch object stays small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from orchestrator.core.records import BatchRequestError
from orchestrator.core.spec import MAX_LINE_BYTES, InputSpec, SamplingSpec
from orchestrator.prepare.formats import URLS, BadRow, make_converter, runner_of
from orchestrator.prepare.sources import loads_json, read_lines

MAX_LISTED = 1000

_DUPLICATE = (
    "The custom_id for this request is a duplicate of another request. "
    "The custom_id parameter must be unique for each request in a batch."
)


@dataclass
class Validation:
    errors: list[BatchRequestError] = field(default_factory=list)
    #: Problems found, listed or not.
    problems: int = 0
    requests: int = 0
    model: str | None = None
    #: serve.several_models: lines may name several served models.
    several: bool = False
    #: The served models the lines name, in the order of their first line.
    named: list[str] = field(default_factory=list)

    def add(self, code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        self.problems += 1
        if len(self.errors) < MAX_LISTED:
            self.errors.append(BatchRequestError(code=code, message=message, line=line, param=param))


def too_large(size: int, max_bytes: int) -> BatchRequestError | None:
    """The size check, made before the file is read at all."""
    if size <= max_bytes:
        return None
    return BatchRequestError(
        code="file_too_large",
        message=f"The batch input file is {size:,} bytes, larger than the {max_bytes:,} bytes this server "
        "accepts in one batch. Please try again with a smaller batch.",
    )


def validate_input(
    stream: BinaryIO,
    *,
    endpoint: str,
    models: Mapping[str, str],
    max_requests: int,
    max_line_bytes: int = MAX_LINE_BYTES,
    several: bool = False,
) -> Validation:
    """Read the file line by line (blank lines are skipped, as `prepare` does) and list its problems.
    `models` maps each served name to its runner: a batch's model must answer its endpoint."""
    result = Validation(several=several)
    # The converter `orch prepare` runs on this file: a line it would set aside fails validation here.
    convert = make_converter(InputSpec(format="openai-batch"), SamplingSpec(), None, runner_of(endpoint))
    seen: set[str] = set()
    for number, raw, too_long in read_lines(stream, max_line_bytes):
        if too_long is not None:
            result.requests += 1
            result.add("line_too_large", _too_large_line(too_long, max_line_bytes), number)
            continue
        if not raw.strip():
            continue
        result.requests += 1
        try:
            request = loads_json(raw)
        except ValueError as e:
            result.add("invalid_json_line", f"This line is not parseable as valid JSON: {e}.", number)
            continue
        if not isinstance(request, dict):
            result.add("invalid_request", "Each line must be a JSON object (a request).", number)
            continue
        before = result.problems
        _check_request(request, number, endpoint, models, seen, result)
        if result.problems == before:
            try:
                convert(request, "input", number)
            except BadRow as e:
                result.add("invalid_request", f"This request is not valid: {e}.", number)
    if result.requests > max_requests:
        result.add(
            "too_many_tasks",
            f"The batch input file holds {result.requests:,} requests, more than the {max_requests:,} this "
            "server accepts in one batch. Please split it into smaller batches.",
        )
    return result


def _too_large_line(size: int, max_bytes: int) -> str:
    return (
        f"This line is {size:,} bytes, longer than the {max_bytes:,} bytes this server reads in one line "
        "(input.max_line_bytes). Please shorten the request, or raise the limit."
    )


def _check_request(
    request: dict[str, Any],
    number: int,
    endpoint: str,
    models: Mapping[str, str],
    seen: set[str],
    result: Validation,
) -> None:
    """The problems of one request line, each added with its line number."""
    for name, kind in (("custom_id", str), ("method", str), ("url", str), ("body", dict)):
        if name not in request:
            result.add("missing_required_parameter", f"Missing required parameter: '{name}'.", number, name)
        elif not isinstance(request[name], kind):
            expected = "a JSON object" if kind is dict else "a string"
            result.add("invalid_request", f"The '{name}' parameter must be {expected}.", number, name)
    custom_id, method, url, body = (request.get(k) for k in ("custom_id", "method", "url", "body"))
    if isinstance(custom_id, str):
        if custom_id in seen:
            result.add("duplicate_custom_id", _DUPLICATE, number, "custom_id")
        seen.add(custom_id)
    if isinstance(method, str) and method != "POST":
        result.add("invalid_request", f"The method must be POST, not {method!r}.", number, "method")
    if isinstance(url, str) and url != endpoint:
        result.add("invalid_url", "The URL provided for this request does not match the batch endpoint.", number, "url")
    if isinstance(body, dict):
        _check_model(body.get("model"), number, endpoint, models, result)


def _check_model(model: Any, number: int, endpoint: str, models: Mapping[str, str], result: Validation) -> None:
    """A served model that answers the endpoint, the same on every line (the first valid one sets the batch's)."""
    if model is None:
        result.add("missing_required_parameter", "Missing required parameter: 'body.model'.", number, "body.model")
    elif not isinstance(model, str) or model not in models:
        served = ", ".join(sorted(models))
        result.add(
            "model_not_found",
            f"The model {model!r} does not exist or is not served here. This server serves: {served}.",
            number,
            "body.model",
        )
    elif models[model] != runner_of(endpoint):
        able = sorted(name for name, runner in models.items() if runner == runner_of(endpoint))
        result.add(
            "model_not_supported",
            f"The model {model!r} does not support {endpoint}: it is served with model.runner {models[model]} "
            f"({', '.join(URLS[models[model]])}). Served models for {endpoint}: {', '.join(able) or 'none'}.",
            number,
            "body.model",
        )
    elif result.model is None:
        result.model = model
        result.named.append(model)
    elif result.several:
        if model not in result.named:
            result.named.append(model)
    elif model != result.model:
        result.add(
            "model_mismatch",
            f"The model {model!r} differs from the batch's model {result.model!r}: a batch uses one model.",
            number,
            "body.model",
        )

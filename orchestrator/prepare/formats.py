"""Input rows into canonical request lines (OpenAI Batch requests), one format at a time.

A request line carries only what the input row itself set: the spec's sampling defaults are
applied by the worker at run time, so a default changed before launch is not baked into chunks.
The spec's response_format is in every line, its JSON schema as a reference to the one copy the
run stores (core/request/json_schema.py): a 200 KB schema is not copied into a million lines.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator.core.errors import SpecError
from orchestrator.core.request.json_schema import referenced
from orchestrator.core.spec import InputSpec, SamplingSpec

CHAT_URL = "/v1/chat/completions"
COMPLETION_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
#: vLLM's scoring endpoints (its `run_batch` answers them): on an embedding model, the cosine
#: similarity of two texts' embeddings.
SCORE_URL = "/v1/score"
RERANK_URL = "/v1/rerank"
RESPONSES_URL = "/v1/responses"
#: The lines a run takes, by its model's runner: a run generates or pools (embeds, scores), never both.
URLS = {"generate": (CHAT_URL, COMPLETION_URL, RESPONSES_URL), "pooling": (EMBEDDINGS_URL, SCORE_URL, RERANK_URL)}


def runner_of(url: str) -> str:
    """The runner whose workers answer a URL's lines: generate, or pooling (embeddings, score, rerank)."""
    return "pooling" if url in URLS["pooling"] else "generate"


#: The body fields a score request may compare (vLLM's ScoreRequest forms), first against second.
SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
#: Keys of the FM-inference runner's completion objects that are not request parameters.
_COMPLETION_NOT_PARAMS = {"engine", "model", "request_time", "result", "request"}
#: A rough, tokenizer-free estimate: English text averages about 4 characters per token.
CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


class BadRow(ValueError):
    """This row cannot become a request; the message says why."""


@dataclass(frozen=True)
class Request:
    custom_id: str
    line: bytes  # the canonical request line, newline included
    est_prompt_tokens: int
    max_output_tokens: int
    #: The model the input line itself named (`body.model`, a completion object's `model`), if any:
    #: every line is answered by the run's model, and prepare says how many named another.
    named_model: str | None = None
    #: The line's URL and body as built, for prepare's request check (not compared: the line says it all).
    url: str = field(default="", compare=False, repr=False)
    body: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: The body's own temperature and whether it sets a seed (None: left to the spec and the model),
    #: for answer_keys.AnswerKeys.sampled.
    temperature: float | None = None
    seeded: bool | None = None
    #: A run of several models: the one answering the row (a `models:` key), set by prepare's router.
    pool: str | None = None


#: What `make_converter` gives: (record, source name, row number) -> the row's request.
Converter = Callable[[dict[str, Any], str, int], "Request"]


def make_converter(
    spec_input: InputSpec, sampling: SamplingSpec, model: str | None, runner: str = "generate"
) -> Converter:
    """The function turning (record, source name, row number) into a Request, for the spec's format
    and the run's runner (a pooling run embeds: openai-batch embeddings lines, or text to embed)."""
    fmt = spec_input.format
    _check_response_format(spec_input, runner)
    # The spec's schema is stored once in the run: each line carries its reference (core/request/json_schema.py).
    response_format = referenced(spec_input.response_format)
    if fmt == "openai-batch":
        return lambda record, _source, _number: _openai_batch(record, sampling, URLS[runner])
    if runner == "pooling" and fmt != "text":

        def refuse(_record: dict[str, Any], _source: str, _number: int) -> Request:
            raise BadRow(f"format {fmt!r} asks for generation; a pooling run embeds: use --format text or openai-batch")

        return refuse

    def with_id(
        build: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]],
        named: Callable[[dict[str, Any]], str | None] = lambda _record: None,
    ) -> Converter:
        def convert(record: dict[str, Any], source: str, number: int) -> Request:
            custom_id = _custom_id(record, spec_input.id_column, source, number)
            url, body = build(record)
            if model and "model" not in body:
                body = {"model": model, **body}
            if response_format is not None:
                body["response_format"] = response_format
            return _request(custom_id, url, body, sampling, named(record))

        return convert

    if fmt == "completion":
        return with_id(lambda record: (COMPLETION_URL, _completion_body(record, spec_input.id_column)), _named_model)
    if fmt == "chat":
        return with_id(lambda record: (CHAT_URL, {"messages": _chat_messages(record, spec_input)}))
    if fmt == "text" and runner == "pooling":
        return with_id(lambda record: (EMBEDDINGS_URL, {"input": _text(record, spec_input)}))
    if fmt == "text":
        return with_id(lambda record: _text_body(record, spec_input))
    raise ValueError(f"unknown input format {fmt!r}")


def fallback_custom_id(record: dict[str, Any] | None, spec_input: InputSpec, source: str, number: int) -> str | None:
    """The custom_id a row set aside at prepare is answered under: its own, or the one its format
    would have given it; None when it has none (a line that is not JSON, with an id column: the
    errors file then gives it a stand-in, `line-<n>`)."""
    if record is None:
        return None if spec_input.format == "openai-batch" or spec_input.id_column else f"{source}:{number}"
    if spec_input.format == "openai-batch":
        custom_id = record.get("custom_id")
        return custom_id if isinstance(custom_id, str) and custom_id else None
    try:
        return _custom_id(record, spec_input.id_column, source, number)
    except BadRow:
        return None


def needed_columns(spec_input: InputSpec) -> list[str] | None:
    """The Parquet columns a format reads (None: all of them)."""
    id_cols = [spec_input.id_column] if spec_input.id_column else []
    if spec_input.format == "chat":
        read = spec_input.columns() or [spec_input.conversation_column]
        return [*read, *(c for c in id_cols if c not in read)]
    return None


def _custom_id(record: dict[str, Any], id_column: str | None, source: str, number: int) -> str:
    if id_column is None:
        return f"{source}:{number}"
    if id_column not in record:
        raise BadRow(f"no id column {id_column!r} (the row has {_columns(record, [id_column])})")
    value = record[id_column]
    if value is None or value == "":
        raise BadRow(f"no value in the id column {id_column!r}")
    return str(value)


#: The standard library's encoder, for what orjson refuses (an int beyond 64 bits, a key that is
#: not a string): one for every line, as json.dumps with non-default options builds one per call.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def encode_line(record: dict[str, Any]) -> bytes:
    """A canonical request line: compact JSON, text as UTF-8, a newline. orjson writes it several
    times faster than the standard library, byte for byte the same on text and ints (a float may be
    spelt otherwise with the same value, 1e-7 for 1e-07; a NaN becomes null, valid JSON, where
    json.dumps wrote NaN, which is not)."""
    try:
        # Copied to a bytes object of its own length: orjson's keeps the whole buffer it wrote
        # into (200,000 lines of 500 bytes held 786 MiB, copied 114 MiB), and a grouped prepare
        # holds a run of lines in memory.
        return bytes(memoryview(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)))
    except TypeError:  # orjson.JSONEncodeError
        return _ENCODE(record).encode() + b"\n"


def _request(
    custom_id: str, url: str, body: dict[str, Any], sampling: SamplingSpec, named_model: str | None = None
) -> Request:
    model = body.get("model")
    if isinstance(model, str) and next(iter(body)) != "model":
        # body.model first: answer keys leave a model's name out of the key (answer_keys.LineKeys).
        body = {"model": model, **{k: v for k, v in body.items() if k != "model"}}
    line = encode_line({"custom_id": custom_id, "method": "POST", "url": url, "body": body})
    budget = 0 if url in URLS["pooling"] else _output_budget(body, sampling)  # pooling generates nothing
    temperature = body.get("temperature")
    return Request(
        custom_id,
        line,
        _prompt_tokens(body),
        budget,
        named_model,
        url=url,
        body=body,
        temperature=float(temperature) if isinstance(temperature, (int, float)) else None,
        seeded=True if body.get("seed") is not None else None,
    )


def rebuilt(custom_id: str, url: str, body: dict[str, Any], request: Request, sampling: SamplingSpec) -> Request:
    """`request` with another custom_id and body (a sweep's arm): its line and output budget made again."""
    return dataclasses.replace(_request(custom_id, url, body, sampling), named_model=request.named_model)


def _openai_batch(record: dict[str, Any], sampling: SamplingSpec, urls: tuple[str, ...]) -> Request:
    custom_id, url, body = record.get("custom_id"), record.get("url"), record.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise BadRow("no custom_id string")
    if url not in urls:
        runner = runner_of(str(url))
        needs = f" (it needs a run with model.runner: {runner})" if url in URLS[runner] else ""
        raise BadRow(f"url {url!r} is not one of {', '.join(urls)}{needs}")
    if record.get("method", "POST") != "POST":
        raise BadRow(f"method {record.get('method')!r} is not POST")
    if not isinstance(body, dict):
        raise BadRow("no body object")
    if url == CHAT_URL and not isinstance(body.get("messages"), list):
        raise BadRow("a chat request needs body.messages (a list)")
    if url == COMPLETION_URL and not isinstance(body.get("prompt"), (str, list)):
        raise BadRow("a completion request needs body.prompt")
    if url == EMBEDDINGS_URL and not isinstance(body.get("input"), (str, list)):
        raise BadRow("an embeddings request needs body.input")
    if url == RERANK_URL and not ("query" in body and "documents" in body):
        raise BadRow("a rerank request needs body.query and body.documents")
    if url == SCORE_URL and not any(a in body and b in body for a, b in SCORE_PAIRS):
        raise BadRow(f"a score request needs one of {' / '.join(f'{a} and {b}' for a, b in SCORE_PAIRS)}")
    if url == RESPONSES_URL and not isinstance(body.get("input"), (str, list)):
        raise BadRow("a responses request needs body.input (a string or a list of input items)")
    return _request(custom_id, url, body, sampling, _named_model(body))


def _named_model(mapping: dict[str, Any]) -> str | None:
    named = mapping.get("model")
    return named if isinstance(named, str) and named else None


def _completion_body(record: dict[str, Any], id_column: str | None) -> dict[str, Any]:
    if not isinstance(record.get("prompt"), str):
        raise BadRow("no prompt string")
    # The id column became the custom_id: left in the body, it would be refused as a parameter.
    return {k: v for k, v in record.items() if k not in _COMPLETION_NOT_PARAMS and k != id_column and v is not None}


def _check_response_format(spec_input: InputSpec, runner: str) -> None:
    """input.response_format asks for generation (the spec checks its format): refused at once on a pooling run."""
    if spec_input.response_format is not None and runner == "pooling":
        raise SpecError("input.response_format asks for generation; a pooling run embeds", hint="drop --json-schema")


def _chat_messages(record: dict[str, Any], spec_input: InputSpec) -> list[dict[str, str]]:
    if spec_input.template is not None:  # the template's text is the user turn: no conversation column
        return _with_system([{"role": "user", "content": _text(record, spec_input)}], spec_input)
    if spec_input.conversation_column not in record:
        raise BadRow(
            f"no column {spec_input.conversation_column!r} "
            f"(the row has {_columns(record, [spec_input.conversation_column])})"
            + "".join(f"; {name!r} holds chat turns: --conversation-column {name}" for name in _turn_columns(record))
        )
    conversation = record.get(spec_input.conversation_column)
    if not isinstance(conversation, list) or not conversation:
        holds = "nothing" if conversation is None else f"a {type(conversation).__name__}"
        raise BadRow(f"column {spec_input.conversation_column!r} is not a list of turns ({holds})")
    turns = []
    for i, turn in enumerate(conversation):
        if not _is_turn(turn):
            raise BadRow(f"turn {i} has no role/content strings")
        turns.append({"role": turn["role"], "content": turn["content"]})
    users = [i for i, t in enumerate(turns) if t["role"] == "user"]
    if not users:
        raise BadRow("the conversation has no user turn")
    # "first": the SkyPilot example's choice; "all": everything up to the last user turn.
    messages = [turns[users[0]]] if spec_input.turns == "first" else turns[: users[-1] + 1]
    return _with_system(messages, spec_input)


def _with_system(messages: list[dict[str, str]], spec_input: InputSpec) -> list[dict[str, str]]:
    if spec_input.system_prompt:
        return [{"role": "system", "content": spec_input.system_prompt}, *messages]
    return messages


def _text(record: dict[str, Any], spec_input: InputSpec) -> str:
    """The template filled from the row's columns; without a template, the text column's value."""
    if spec_input.template is None:
        if spec_input.text_column not in record:
            raise BadRow(
                f"no column {spec_input.text_column!r} (the row has {_columns(record, [spec_input.text_column])})"
            )
        return format(as_field(record[spec_input.text_column]))
    missing = [c for c in spec_input.columns() or [] if c not in record]
    if missing:
        names = ", ".join(map(repr, missing))
        raise BadRow(
            f"the template names column(s) {names}, which the row lacks (the row has {_columns(record, missing)})"
        )
    try:
        return spec_input.template.format(**{k: as_field(v) for k, v in record.items()})
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
        raise BadRow(f"the template cannot be filled from this row ({e}; the row has {_columns(record)})") from None


def as_field(value: Any) -> Any:
    """A column's value as a template writes it (docs/labelling.md): a struct or a list as JSON
    (`{"a": 0}`, `["t0"]`, not Python's `{'a': 0}`), its members still reachable (`{tags[0]}`,
    `{meta[source]}`); true and false; a null as nothing; a number as itself (`{price:.2f}` applies);
    anything else as its text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return _JsonField(value)
    return value


class _JsonField:
    """A struct or list column in a template: JSON where written whole, its members by index."""

    def __init__(self, value: dict[str, Any] | list[Any] | tuple[Any, ...]):
        self.value = value

    def __getitem__(self, key: Any) -> Any:
        return as_field(self.value[key])

    def __format__(self, spec: str) -> str:
        return format(json.dumps(self.value, ensure_ascii=False, default=str), spec)


def _columns(record: dict[str, Any], missing: Sequence[str] = ()) -> str:
    """The row's columns, for a message: `text, id` (the first 10), and the closest to a missing
    name (`; did you mean 'priority'?`), as the spec checker suggests a close field."""
    names = [str(name) for name in record]
    listed = (", ".join(names[:10]) + (", ..." if len(names) > 10 else "")) if names else "no columns"
    return listed + close_names(missing, names)


def _is_turn(turn: Any) -> bool:
    """A chat turn as the chat format reads one: an object with `role` and `content` strings."""
    return isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)


def _turn_columns(record: dict[str, Any]) -> list[str]:
    """The row's columns that hold chat turns, such as OpenAI's and most chat datasets' `messages`:
    what `--conversation-column` could name and read."""
    return [
        str(name) for name, value in record.items() if isinstance(value, list) and value and all(map(_is_turn, value))
    ]


def close_names(missing: Sequence[str], names: Sequence[str]) -> str:
    """`; did you mean 'priority'?` for a missing name close to one of `names` (several missing:
    `'subject' for 'Subject', ...`); empty when none is close."""
    pairs = [(name, c[0]) for name in missing if (c := difflib.get_close_matches(name, names, n=1))]
    if not pairs:
        return ""
    if len(missing) == 1:
        return f"; did you mean {pairs[0][1]!r}?"
    return "; did you mean " + ", ".join(f"{close!r} for {name!r}" for name, close in pairs) + "?"


def _text_body(record: dict[str, Any], spec_input: InputSpec) -> tuple[str, dict[str, Any]]:
    text = _text(record, spec_input)
    if spec_input.text_as == "completion":
        return COMPLETION_URL, {"prompt": text}
    return CHAT_URL, {"messages": _with_system([{"role": "user", "content": text}], spec_input)}


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        chars = sum(
            len(m.get("content") or "") if isinstance(m, dict) and isinstance(m.get("content"), str) else 0
            for m in body["messages"]
        )
        return chars // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS * len(body["messages"])
    prompt = body.get("prompt", body.get("input"))
    if prompt is None:  # score and rerank: every text is embedded once
        prompt = [body.get(k) for k in ("query", *(k for pair in SCORE_PAIRS for k in pair)) if body.get(k)]
    return len(prompt if isinstance(prompt, str) else "".join(map(str, prompt or []))) // CHARS_PER_TOKEN + 1


def _output_budget(body: dict[str, Any], sampling: SamplingSpec) -> int:
    max_tokens = (
        body.get("max_tokens")
        or body.get("max_completion_tokens")
        or body.get("max_output_tokens")
        or sampling.max_tokens
    )
    n = body.get("n") or sampling.n
    try:
        return int(max_tokens) * int(n)
    except (TypeError, ValueError):
        return sampling.max_tokens * sampling.n

"""The documented shape of `orch status --json`, generated from the read model's types, never written by hand.

`markdown()` renders every field of RunStatus (runview/sections.py), nested sections as dotted
paths, with its JSON type and description, then the words of the run's state, a worker's activity
and a recovery (runview/states.py) with what each means. docs/operations.md holds that text between
BEGIN and END; tests/test_status.py checks it is what the types say today. After changing a type:

    python -m orchestrator.runview.schema_doc --write docs/operations.md
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from orchestrator.runview.sections import RunStatus
from orchestrator.runview.states import Recovery, RunState, WorkerActivity

BEGIN = "<!-- status-json: generated from runview/sections.py (python -m orchestrator.runview.schema_doc) -->"
END = "<!-- /status-json -->"


def markdown() -> str:
    """The fields table and the words tables, between BEGIN and END."""
    lines = [BEGIN, "", "| field | type | what |", "|---|---|---|"]
    lines += [f"| `{path}` | {kind} | {what} |" for path, kind, what in fields(RunStatus)]
    for title, words in (
        ("`state`: the run", RunState),
        ("`workers[].activity`: what a worker does", WorkerActivity),
        ("`workers[].recovery`: what a recovery was", Recovery),
    ):
        lines += ["", f"| {title} | meaning |", "|---|---|"]
        lines += [f"| `{word.value}` | {_cell(word.meaning)} |" for word in words]
    return "\n".join([*lines, "", END])


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted path, JSON type, description) of each field of `model`, nested models' fields after
    theirs: `rows.done`, `workers[].state`, `models.<key>.rows.total`."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, _cell(type_words(info.annotation)), _cell(info.description or "")
        for inner, suffix in _nested(info.annotation):
            yield from fields(inner, f"{path}{suffix}.")


def type_words(annotation: Any) -> str:
    """A type as JSON says it: `int`, `number`, `string | null`, `[object]`, `{key: number}`, `"a" | "b"`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_words(a) for a in args)
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in annotation)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return f"{{key: {type_words(args[1])}}}"
    if origin is tuple:
        return "[" + ", ".join(type_words(a) for a in args) + "]"
    if isinstance(origin, type) and issubclass(origin, Sequence):
        return f"[{type_words(args[0])}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    names = {int: "int", float: "number", str: "string", bool: "bool", type(None): "null"}
    return names.get(annotation, str(annotation))


def _nested(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """The models inside a field's type, each with how its path goes on (`.`, `[]`, `.<key>`)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, ""
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _nested(arg)
    elif isinstance(origin, type) and issubclass(origin, Mapping):
        yield from ((inner, f".<key>{suffix}") for inner, suffix in _nested(args[1]))
    elif isinstance(origin, type) and origin is not tuple and issubclass(origin, Sequence):
        yield from ((inner, f"[]{suffix}") for inner, suffix in _nested(args[0]))


def _cell(text: str) -> str:
    """Text that a markdown table cell holds as it is."""
    return text.replace("|", "\\|").replace("\n", " ")


def section_of(text: str) -> str | None:
    """The generated section in a document's `text` (None: it has none)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else None


def write(path: Path) -> bool:
    """Replace the generated section in `path` with today's; whether it changed."""
    text = path.read_text()
    old = section_of(text)
    if old is None:
        raise SystemExit(f"{path}: no section between {BEGIN!r} and {END!r} to replace")
    new = text.replace(old, markdown())
    path.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        print(f"{argv[1]}: {'rewritten' if write(Path(argv[1])) else 'already up to date'}")
        return 0
    print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A spec that does not validate, as one SpecError naming every field in error, each with its file:line."""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.core.errors import SpecError

_SPEC_HINT = "docs/spec.md (the spec: orch.yaml) lists every field and what it takes"


def spec_error(e: ValidationError, source: str, lines: Any, root: type[BaseModel]) -> SpecError:
    """Every field in error at once (one per field), each with its file:line and a close name for a typo."""
    problems: dict[str, tuple[str, str, str | None]] = {}
    for err in sorted(e.errors(), key=lambda err: _line_of(lines, _loc(err)) or 0):
        field, msg, where, close = _problem(err, source, lines, root)
        problems.setdefault(field, (msg, where, close))
    if len(problems) == 1:
        field, (msg, where, close) = next(iter(problems.items()))
        error = SpecError(f"{field}: {msg}", where=where, hint=f"did you mean {close}?" if close else _SPEC_HINT)
        error.field = field
        return error
    listed = [
        f"{where}: {field}: " + (f"unknown field; did you mean {close}?" if close else msg)
        for field, (msg, where, close) in problems.items()
    ]
    return SpecError(f"{len(problems)} problems:\n  " + "\n  ".join(listed), where=source, hint=_SPEC_HINT)


def _loc(err: Any) -> list[str]:
    return [str(p) for p in err.get("loc", ()) if not str(p).startswith("function-")]


def _problem(err: Any, source: str, lines: Any, root: type[BaseModel]) -> tuple[str, str, str, str | None]:
    """(field, what is wrong, where, the field it may be a typo of) for one of pydantic's errors."""
    loc = _loc(err)
    field = ".".join(loc) or "(top level)"
    msg = err.get("msg", "invalid")
    close_name = None
    if err.get("type") == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        known = ", ".join(parent.model_fields) if parent else ""
        msg = f"unknown field{f' (known: {known})' if known else ''}"
        close = difflib.get_close_matches(loc[-1], list(parent.model_fields) if parent else [], n=1)
        if close:
            close_name = ".".join([*loc[:-1], close[0]])
    elif "input" in err and err.get("input") is not None:
        msg = f"{msg} (got {repr(err['input'])[:80]})"
    where = source
    line = _line_of(lines, loc)
    if line is not None:
        where = f"{source}:{line}"
    elif source == "environment":
        where = "ORCH_" + "__".join(p.upper() for p in loc) if len(loc) > 1 else source
    return field, msg, where, close_name


def _model_at(root: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    model = root
    for part in path:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _line_of(node: Any, loc: list[str]) -> int | None:
    """The 1-based line of the YAML node at `loc`, or of its nearest existing parent."""
    if node is None:
        return None
    line: int = node.start_mark.line + 1
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if str(key_node.value) == part:
                node, line = value_node, key_node.start_mark.line + 1
                break
        else:
            break
    return line

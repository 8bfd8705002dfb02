"""A spec's `model.chat_template`, read once where the command runs: a file's path becomes the file's text.

The template decides every chat answer, so a run keeps its text, not its path: the frozen spec
then holds what the workers render with (a worker on another machine needs no copy of the file),
an edited file is a changed spec (refused on an existing run, like any other frozen field), and
the answer keys of reuse cover the text itself (prepare/answers/answer_keys.py), never a path that can
name other text tomorrow.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from orchestrator.core.errors import ChatTemplateError

if TYPE_CHECKING:
    from orchestrator.core.spec import ModelSpec, RunSpec


def read_chat_template(value: str | None) -> str | None:
    """The template's text: `value` itself when it is a Jinja template, else the text of the file it
    names (relative to the current directory)."""
    if value is None:
        return None
    if _is_template(value):
        return value
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"model.chat_template: cannot read {value!r}: {e}") from None
    # Neither a file nor Jinja: most likely a path that does not exist here. Used as the template
    # it would replace every prompt with this string.
    raise ChatTemplateError(
        f"model.chat_template: {value!r} is neither a file on this machine nor a Jinja template",
        hint="give the template's text, or the path of a file that holds it (relative to the current directory)",
    )


def _is_template(value: str) -> bool:
    return "{{" in value or "{%" in value


def with_templates_read(spec: RunSpec, *, lenient: bool = False) -> RunSpec:
    """`spec` with every model's chat template as its text (the run's model, each of `models:` and
    `serve.models`). `lenient`: a file that cannot be read is left as named (a spec frozen by an
    older orch, whose template file may be gone; it then differs from any text, and says so)."""
    updates: dict[str, object] = {}
    model = _model_read(spec.model, lenient)
    if model is not spec.model:
        updates["model"] = model
    for field in ("models", "serve"):
        entries = spec.models if field == "models" else spec.serve.models
        read = {name: _model_read(entry, lenient) for name, entry in entries.items()}
        if any(read[name] is not entries[name] for name in entries):
            updates[field] = read if field == "models" else spec.serve.model_copy(update={"models": read})
    return spec.model_copy(update=updates) if updates else spec


def _model_read(model: ModelSpec, lenient: bool) -> ModelSpec:
    value = model.chat_template
    if value is None or _is_template(value):
        return model
    try:
        text = read_chat_template(value)
    except ChatTemplateError:
        if lenient:
            return model
        raise
    return model.model_copy(update={"chat_template": text})

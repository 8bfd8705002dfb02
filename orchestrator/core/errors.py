"""The one exception family orch raises for users, and the one place that turns them into what users read.

Each error carries a ready message, an optional hint and an exit code (see the README's table);
`render_error` prints `ERROR <where>: <message>` and `hint: ...` on stderr for every program that
talks to users: the `orch` CLI, the worker, the API server.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TextIO


class OrchError(Exception):
    """Something the user can act on. The CLI prints `ERROR <message>` and the hint, never a traceback.

    `where` names the place the problem was found (a file and line, a spec field, a store key).
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, where: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class SpecError(OrchError):
    """The run spec (file, environment or flags) is invalid."""

    exit_code = 2


class SpecConflict(OrchError):
    """The spec differs from the one frozen into the run: mixing them would corrupt the outputs."""

    exit_code = 3


class InputError(OrchError):
    """The input dataset cannot be read, or a line of it is bad (with --strict)."""

    exit_code = 4


class RunNotFound(OrchError):
    """The run (or a part of it a command needs, such as its manifest or plan) is not in the store."""

    exit_code = 5


class BackendError(OrchError):
    """A backend (SkyPilot, local processes) refused or failed an operation."""

    exit_code = 6


class IncompleteRun(OrchError):
    """The run is not complete: chunks without markers, or rows missing from the outputs."""

    exit_code = 7


class TooManyErrors(OrchError):
    """The output was written, but more of its rows are errors than `--max-error-rate` allows."""

    exit_code = 9


def render_error(error: OrchError, stream: TextIO | None = None) -> None:
    """The one way an error reaches a user: a red ERROR line and a yellow hint on a terminal, plain
    text elsewhere; the traceback too with ORCH_DEBUG=1. Call it while handling the exception."""
    stream = stream or sys.stderr
    if os.environ.get("ORCH_DEBUG"):
        traceback.print_exc(file=stream)
    colour = stream.isatty() and not os.environ.get("NO_COLOR")

    def paint(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if colour else text

    print(f"{paint('ERROR', '1;31')} {error}", file=stream)
    if error.hint:
        print(f"{paint('hint', '33')}: {error.hint}", file=stream)

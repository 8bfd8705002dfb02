"""The one exception family orch raises for users: each renders a ready message, an optional hint and an exit code."""

from __future__ import annotations


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

"""The one exception family orch raises for users, and the one place that turns them into what users read.

Each error carries a ready message, an optional hint and an exit code (see the table in docs/operations.md);
`render_error` prints `ERROR <where>: <message>` and `hint: ...` on stderr for every program that
talks to users: the `orch` CLI, the worker, the API server.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TextIO

from orchestrator.core.exits import WorkerExit


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
    #: The spec field at fault, dotted (`chunking.num_chunks`), when one is: a command renames it
    #: to the flag that set it.
    field: str | None = None


class SpecConflict(OrchError):
    """The spec differs from the one frozen into the run: mixing them would corrupt the outputs."""

    exit_code = 3


class InputError(OrchError):
    """The input dataset cannot be read, or a line of it is bad (with --strict)."""

    exit_code = 4


class RequestsRefused(InputError):
    """`orch prepare` checked the request lines and found some the workers would refuse: nothing was written."""

    exit_code = 10


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


class CorruptOutput(OrchError):
    """A part's bytes do not match its done marker, or a positions file is missing or damaged."""

    exit_code = 8


class OutputError(OrchError):
    """The output cannot be written as asked: a format orch does not write, a directory that refuses it."""


class LaunchFailed(BackendError):
    """Some workers could not be submitted. Those that were are in `launched`, so none is lost track of."""

    def __init__(self, launched: dict[int, str], failures: dict[int, str], hint: str | None = None):
        lines = "\n  ".join(f"worker {w}: {reason}" for w, reason in sorted(failures.items()))
        super().__init__(f"launch: {len(failures)} worker(s) not submitted:\n  {lines}", hint=hint)
        self.launched = launched
        self.failures = failures


class CorruptRecord(OrchError):
    """An object in the store does not parse as the document its key says it is."""


class StoreContention(OrchError):
    """A document kept changing under a read-change-write: many writers at once."""


class ChunkBusy(OrchError):
    """`orch redo` of a chunk a worker is working on (it has no marker: nothing to redo yet)."""


class OutageTooLong(OrchError):
    """The store stayed unreachable for longer than the outage budget."""

    #: The controller (and SkyPilot's `recover_on_exit_codes`) starts such a worker again without
    #: counting a failure.
    exit_code = WorkerExit.STORE_UNREACHABLE


class StoreError(OrchError):
    """The store could not be reached or refused an operation (after retries)."""


class StoreUnavailable(StoreError):
    """The store did not answer (unreachable, timed out, 5xx, throttled) after the client's own retries.

    A passing condition, not a refusal: workers and `orch watch` wait it out for their outage budget
    (core/protocol/outage.py); interactive commands report it.
    """


class StoreFull(StoreUnavailable):
    """The file system under a local store has no space left (ENOSPC, EDQUOT). Waited out like an
    outage by workers and `orch watch` (someone frees space); one ERROR line for other commands."""


class StoreBusy(StoreUnavailable):
    """Another process held a local store's write lock for longer than `store_settings.lock_timeout`."""


class NotFound(StoreError):
    """The key does not exist."""

    def __init__(self, key: str):
        super().__init__(f"no object at {key!r}", where=None)
        self.key = key


class PreconditionFailed(StoreError):
    """A conditional write lost: the key already exists (put_if_absent) or changed (compare_and_swap).

    This is an expected outcome of races between workers, not a failure: callers branch on it.
    """

    def __init__(self, key: str):
        super().__init__(f"precondition failed for {key!r}")
        self.key = key


class InvalidKey(StoreError):
    """A key that would escape the store root or that the backends cannot hold."""


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


class EngineLoadError(OrchError):
    """A worker could not load the model: a wrong path, an unsupported architecture, too little memory."""


class ChatTemplateError(SpecError):
    """The spec's `model.chat_template` names a file that cannot be read, or is neither a file nor a template."""
